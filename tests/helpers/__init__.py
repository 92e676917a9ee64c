"""What several test modules share: real stores and rows (``persist``), a
running consensus server (``server``), the ``shardsink`` command (``cli``),
clusters and builder harnesses (``cluster``), shared-memory parts and helper
children (``shm``), trivial process roles (``roles``), and waiting for what
cannot signal (``wait``). Imported as
``tests.helpers.NAME`` (pytest's ``pythonpath`` puts the repository root on
``sys.path``)."""
