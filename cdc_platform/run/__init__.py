"""The jobs: the ingest stream, the stage queries over the raw log, and their reports."""
