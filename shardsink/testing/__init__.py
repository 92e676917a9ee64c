"""Real services and leak checks for tests and benchmarks.

``postgres.PostgresServer`` and ``s3.S3Server`` start real servers on loopback
in a temporary directory and stop them (by pid) on ``stop()``/``__exit__``.
"""
