"""The ground everything stands on: the Spark session, its jobs, errors, daemons and processes."""
