"""Real services and emulated hosts for tests and benchmarks (docs/api.md).

``PostgresServer`` and ``S3Server`` start real servers on loopback (or an
emulated host's address) in a temporary directory and stop them (by pid) on
``stop()``/``__exit__``; ``RayTestCluster`` is a real Ray cluster of N nodes
on 127.0.0.1; ``EmulatedCluster`` makes hosts as network namespaces (root),
and ``emulated_cluster`` is a pytest fixture of one that proves at teardown
that nothing of it is left.
"""

import importlib

#: Where each public name lives, loaded on first use (PEP 562): a test that
#: needs PostgreSQL does not import Ray.
_PUBLIC = {
    "EmulatedCluster": "emulated",
    "PostgresServer": "postgres",
    "RayTestCluster": "ray",
    "S3Server": "s3",
    "emulated_cluster": "emulated_fixture",
}


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shardsink.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = sorted(_PUBLIC)
