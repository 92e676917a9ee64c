"""A chaos run's emulated hosts (``chaos --hosts netns:N``).

:class:`RunHosts` makes them: an
:class:`~shardsink.testing.emulated.EmulatedCluster` of N hosts, a Ray node
on each, the consensus server and the stores on hosts of their own, and a
port for this process on their network (the observer's), through which the
run's readers, its maintenance and its final checks reach the consensus
server and the stores as any other host would. It gives the runner:

- where clients reach the consensus server (:attr:`RunHosts.consensus_address`,
  a ``tcp://`` address, CURVE keys in :attr:`RunHosts.keys_dir`) and the
  run's stores;
- a starter of the coordinator on its host, and its flags and environment;
- the consensus server as a target of the nemesis (:meth:`RunHosts.servers`)
  and its restart once dead (:meth:`RunHosts.revive`): a coordinator of
  emulated hosts has no consensus process of its own to restart;
- the faults between the hosts (:attr:`RunHosts.faults`).

:meth:`RunHosts.close` removes it all (idempotent); a run killed before
leaves what ``shardsink hosts sweep`` removes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psutil

from ..netns import NetnsError
from ..process import Starter
from ..testing.emulated import EmulatedCluster
from .config import INTERVAL_MS, SINCE_LAG, ChaosConfig
from .nemesis import Target
from .network import NetworkFaults

log = logging.getLogger(__name__)

#: How long a restart of the consensus server may take before the run tries
#: again at its next look: its store may be across a partition just then.
REVIVE_TIMEOUT_S = 20.0


class RunHosts:
    """The emulated hosts of a run of ``config`` (module doc), their stores
    the data dir ``data``'s unless ``config`` names throwaway servers;
    network faults recorded in ``fault_dir``; ``consensus_env`` goes into
    the consensus server's environment (the run's armed fault points, its
    history). Raises what :class:`EmulatedCluster` raises, having removed
    what it made."""

    def __init__(
        self, config: ChaosConfig, data: Path, fault_dir: Path, consensus_env: dict[str, str]
    ) -> None:
        postgres, s3 = config.emulated_stores
        self.emulated = EmulatedCluster(
            config.network,
            data_dir=data,
            place=config.place,
            postgres=postgres,
            s3=s3,
            store=None if postgres else config.consensus,
            blob=None if s3 else config.blob,
            clocks="clock-skew" in config.faults,
            consensus_args=[
                *("--retain", str(SINCE_LAG * INTERVAL_MS)),
                *("--writer-lease-ms", str(config.writer_lease_ms)),
            ],
            consensus_env=consensus_env,
            observer=True,
            run="chaos",
        )
        place = self.emulated.place
        servers = [place.consensus] + [place.postgres] * postgres + [place.s3] * s3
        assert self.emulated.network is not None
        self.faults = NetworkFaults(self.emulated.network, tuple(dict.fromkeys(servers)), fault_dir)
        #: consensus server restarts after it died (killed, or a fault point)
        self.restarts = 0

    @property
    def consensus_address(self) -> str:
        return self.emulated.consensus_address

    @property
    def keys_dir(self) -> Path:
        """The CURVE keys of the consensus server's clients."""
        return self.emulated.keys_dir

    @property
    def store(self) -> str:
        """The consensus store's URI (secret: never in argv)."""
        return self.emulated.store

    @property
    def blob(self) -> str:
        """The blob store's URI (secret: never in argv)."""
        return self.emulated.blob

    def starter(self) -> Starter:
        """Starts the coordinator on its host."""
        return self.emulated.starter(self.emulated.place.coordinator)

    def coordinator_flags(self) -> list[str]:
        """``up``'s flags for the hosts (Ray, binds, the consensus server,
        the data dir)."""
        return self.emulated.coordinator_flags()

    def coordinator_env(self) -> dict[str, str]:
        return self.emulated.coordinator_env()

    def names(self) -> dict[str, str]:
        """Each host's name (``h0``) by its address."""
        return {host.address: host.name for host in self.emulated.network.hosts}

    def servers(self) -> list[Target]:
        """The consensus server, while it runs, as the nemesis hits it."""
        pid = self.emulated.consensus_pid
        if pid is None:
            return []
        try:
            return [Target("consensus", "consensus", psutil.Process(pid))]
        except psutil.NoSuchProcess:
            return []

    def revive(self) -> bool:
        """Start the consensus server again if it has died; whether it runs
        now (a start that fails is logged and tried again at the next call)."""
        if self.emulated.consensus_pid is not None:
            return True
        try:
            self.emulated.start_consensus(timeout_s=REVIVE_TIMEOUT_S)
        except NetnsError as exc:
            log.warning("the consensus server did not start again: %s", exc)
            return False
        self.restarts += 1
        return True

    def stop_servers(self) -> None:
        """Stop the consensus server (the run is over): the final checks read
        the stores as the only client."""
        self.emulated.stop_consensus()

    def close(self) -> None:
        """Heal every fault, stop everything on the hosts and remove them."""
        try:
            self.faults.heal_all()
        finally:
            self.emulated.close()
