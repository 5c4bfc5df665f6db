"""What is derived from the raw log: latest state, transactions (each its own streaming query)."""
