"""Launching clusters, supervision, process groups and the workloads they write."""
