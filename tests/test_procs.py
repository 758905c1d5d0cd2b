"""Mapping GPU pids to Ray: the parsers on recorded text (Ray 2.60.0), and the raw read on
this host's own processes. Ray workers themselves are covered live (test_live_gpus.py)."""

import os
import subprocess

from rayscope.sources import procs

# Recorded from a Ray 2.60.0 worker's python-core-worker-<id>_<pid>.log (first lines).
CORE_LOG = """\
[2026-11-30 16:43:16,084 I 16887 16887] actor_task_submitter.cc:75: Set actor max pending calls \
to -1 actor_id=7bce49e5591e04628b91e89901000000
[2026-11-30 16:43:16,084 I 16887 16887] core_worker.cc:3247: Creating actor \
actor_id=6a3209ce86b6fbd56ea34ae801000000
[2026-11-30 16:43:16,087 I 16887 16887] task_receiver.cc:117: Actor creation task finished
"""


def test_ray_titles() -> None:
    assert procs.parse_title(["ray::Replica", "", ""]) == "ray::Replica"
    assert procs.parse_title(["ray::Replica" + " " * 300]) == "ray::Replica"
    assert (
        procs.parse_title(["ray::ServeReplica:unet:federated-unet"])
        == "ray::ServeReplica:unet:federated-unet"
    )
    assert procs.parse_title(["/usr/bin/python3", "train.py"]) is None
    assert procs.parse_title([]) is None


def test_worker_log_names() -> None:
    wid = "530002a19e9fcdde429062574eef56f250ab523945b96c8197e7cdfc"
    assert procs.parse_worker_log_name(f"worker-{wid}-01000000-16887.out") == (wid, "01000000", 16887)
    assert procs.parse_worker_log_name(f"worker-{wid}-ffffffff-16887.err") == (wid, "ffffffff", 16887)
    assert procs.parse_worker_log_name("raylet.out") is None
    assert procs.parse_core_log_name(f"python-core-worker-{wid}_16887.log") == (wid, 16887)
    assert procs.parse_core_log_name("python-core-driver-01000000ffff_16516.log") is None


def test_the_actor_a_worker_created_not_the_one_it_called() -> None:
    assert procs.parse_core_log_actor(CORE_LOG) == "6a3209ce86b6fbd56ea34ae801000000"
    assert procs.parse_core_log_actor("nothing about actors here") is None


def test_a_prestarted_workers_job_comes_from_its_log() -> None:
    assert procs.parse_worker_log_job(":job_id:01000000\n:actor_name:Replica\n") == "01000000"
    assert procs.parse_worker_log_job("hello\n") is None


def test_pid_namespace() -> None:
    assert procs.pid_namespace_is_host("pid:[4026531836]") is True
    assert procs.pid_namespace_is_host("pid:[4026532179]") is False
    assert procs.pid_namespace_is_host(None) is None


def test_in_another_pid_namespace_nothing_is_mapped() -> None:
    infos, status = procs.read_processes([os.getpid()], pid_namespace="pid:[4026532179]")
    assert infos is None
    assert not status.ok and status.reason == procs.CONTAINER_REASON


def test_processes_outside_ray_and_pids_that_do_not_exist() -> None:
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            infos, status = procs.read_processes(
                [child.pid, 4_194_999], pid_namespace=procs.HOST_PID_NAMESPACE
            )
        finally:
            child.kill()
    assert status.ok and status.detail == "2 GPU process(es), 0 in Ray"
    assert infos is not None
    sleeping, missing = infos
    assert (sleeping.pid, sleeping.name, sleeping.visible, sleeping.worker_pid) == (
        child.pid,
        "sleep",
        True,
        None,
    )
    assert (missing.pid, missing.visible) == (4_194_999, False)
