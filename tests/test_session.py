"""Where public functions run: the caller's client, the default one, or one started here
(said once); plans checked against that cluster's workers before any task."""

from __future__ import annotations

import distributed
import pytest

from outcore import cluster, session
from outcore.errors import PlanError
from outcore.plan import Plan, TaskMemory


def _plan_of(task_bytes: int):
    def make(resources):
        return Plan.of([TaskMemory("block", 4, task_bytes, 0)], resources)
    return make


def test_the_users_default_client_is_used_and_plans_are_checked_against_its_workers():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit="1GiB", dashboard_address=":0") as lc, \
            distributed.Client(lc) as client:
        assert session.client_for() is client
        fits = session.fitted_plan(_plan_of(50 * 2**20), client, "numpy")
        assert fits.workers == 2 and fits.memory_limit == 2**30
        with pytest.raises(PlanError, match=r"over its budget.*Fix: use block=8; or raise"
                                            r" memory_limit= to") as info:
            session.fitted_plan(_plan_of(2**30), client, "numpy", fixes=["use block=8"])
        assert "--" not in str(info.value)
        assert not client.who_has()  # nothing ran


def test_without_a_client_one_is_started_in_this_process_once_and_said(capsys, monkeypatch):
    def no_client():  # a client another test left as this process's default is not ours
        raise ValueError("no client")

    monkeypatch.setattr(distributed, "get_client", no_client)
    monkeypatch.setattr(cluster, "_default_client", lambda: None)
    monkeypatch.setattr(session, "_OWN", [])
    first = session.client_for()
    try:
        second = session.client_for()
        said = capsys.readouterr().out
        assert first is second and said.count("no Dask client was running") == 1
        assert first.cluster.processes is False
    finally:
        cluster.stop(first)


def test_starting_a_cluster_over_the_users_client_says_so():
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as lc, \
            distributed.Client(lc):
        with pytest.warns(UserWarning, match="in place of the one you had"):
            client = cluster.start("threads", workers=1)
        cluster.stop(client)
