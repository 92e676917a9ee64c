"""The builder side of a group: the builder process (a group's, and the host
builder with ``coalesce`` host), its link to the host builder, and the pure
state machine that decides who receives a shared batch."""
