"""Where lines come from: landing files and Kafka topics (`streams`), and the live source database (`source_connection`, for coverage)."""
