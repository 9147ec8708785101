"""Joining a running cluster by its scheduler address (``tcp://``, ``tls://``, ...): the
cluster is someone else's, so ``stop`` closes only the client."""

from __future__ import annotations

from typing import TYPE_CHECKING

import distributed

from outcore.errors import ClusterError

if TYPE_CHECKING:
    from outcore.cluster.options import ClusterOptions

#: Seconds a joined cluster may have no worker before ``start`` gives up.
JOIN_WORKER_TIMEOUT_S = 60.0


def start(opts: ClusterOptions) -> distributed.Client:
    """A client of the scheduler at ``opts.kind``; ClusterError when none answers within
    30 s, or it has no worker within ``JOIN_WORKER_TIMEOUT_S``."""
    try:
        client = distributed.Client(opts.kind, timeout="30s", security=opts.security())
    except OSError as err:
        raise ClusterError(
            f"No scheduler answered at {opts.kind} within 30 s ({err}).",
            "check the address and that the scheduler is running and reachable.",
        ) from err
    _wait_for_a_worker(client, opts.kind)
    return client


def _wait_for_a_worker(client: distributed.Client, address: str) -> None:
    """Return once the joined cluster has a worker; ClusterError after a timeout."""
    timeout = JOIN_WORKER_TIMEOUT_S
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError as err:
        client.close()
        raise ClusterError(
            f"The scheduler at {address} has had no worker for {timeout:.0f} s.",
            "start workers for it (dask worker ADDRESS), or scale the cluster up first.",
        ) from err
