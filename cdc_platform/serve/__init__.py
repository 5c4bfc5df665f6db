"""How readers reach the lake: `server` (`cdc serve`: Spark Connect and the Thrift JDBC/ODBC server over the
lake's catalog), `sql_client` (`cdc sql`'s side of it), `security` and `passwords` (logins and TLS), `formats`
(rows as a table, CSV or JSON).

Deliberately empty: `cdc sql` against a running server imports `sql_client` and `formats` alone, and a package
that imported `server` would load pyarrow and every view's SQL builder into each of those short processes.
"""
