"""The worker side of a group: the worker process, the builder process, and
the pure state machine that decides who receives a shared batch."""
