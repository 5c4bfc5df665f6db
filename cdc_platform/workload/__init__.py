"""The sample workload and the demo."""
