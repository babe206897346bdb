"""The multi-host launch's pieces without SLURM: host lists and tasks per node in SLURM's compressed forms, TF_CONFIG and the torchrun line from a task's environment, the srun line, and the refusals of --hosts."""

import sys

import pytest

from tasks.common.config.errors import UserError
from tasks.common.process.hosts import expand_nodelist, expand_tasks_per_node, slurm_step, tf_config, torchrun_command

STEP = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[08-09]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


@pytest.mark.parametrize("text, hosts", [
    ("node7", ["node7"]),
    ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
    ("rack[1-2]-n[9-10]", ["rack1-n9", "rack1-n10", "rack2-n9", "rack2-n10"]),
    ("localhost,127.0.0.1", ["localhost", "127.0.0.1"]),
])
def test_slurm_host_lists_expand_in_order(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "a,,b", "gpu[1-x]", "gpu[]"])
def test_a_malformed_host_list_is_refused(text):
    with pytest.raises(ValueError, match="SLURM's form"):
        expand_nodelist(text)


def test_a_tasks_place_in_its_step_gives_tf_config_and_the_torchrun_line():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    step = slurm_step(STEP)
    assert step.task_hosts == ["gpu08", "gpu08", "gpu09", "gpu09"] and (step.task, step.local) == (3, 1)
    config = tf_config(step, 5000)  # every task its own port, so that two tasks of one host never share one
    assert config == {"cluster": {"worker": ["gpu08:5000", "gpu08:5001", "gpu09:5002", "gpu09:5003"]}, "task": {"type": "worker", "index": 3}}
    line = torchrun_command(step, 4, 29400, ["-m", "tasks.common.process.job_main", "train"], "/shared/job")
    assert line[1:] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu08:29400",
                        "--rdzv-id=karman-77", "--log-dir=/shared/job/torchrun", "-m", "tasks.common.process.job_main", "train"]
    with pytest.raises(ValueError, match=r"\(SLURM_JOB_ID, SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE unset\)"):
        slurm_step({})
    with pytest.raises(ValueError, match=r"2 hosts \(gpu\[08-09\]\) but tasks per node for 1"):
        slurm_step(STEP | {"SLURM_STEP_TASKS_PER_NODE": "4"})


def test_the_launcher_starts_one_task_per_host_for_torch_and_one_per_worker_for_tensorflow():
    from tasks.common.process.launch import launcher

    torch_line, tf_line = launcher("torch", 4, hosts=2), launcher("tensorflow", 4, hosts=2)
    assert torch_line[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert tf_line[:5] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--kill-on-bad-exit=1"]
    assert torch_line[6:10] == ["-m", "tasks.common.process.hosts", "torch", "4"] and torch_line[10].isdigit()
    # torchrun's log folders go in the job's folder, which the command removes (not in /tmp, where torchrun leaves them)
    assert launcher("torch", 2, folder="/j")[-3:] == ["--standalone", "--nproc-per-node=2", "--log-dir=/j/torchrun"]
    assert launcher("tensorflow", 1) == [sys.executable]
    with pytest.raises(ValueError, match="torch's launcher of 2 processes needs the job's folder"):
        launcher("torch", 2)


def test_several_hosts_are_refused_in_words_outside_an_allocation_and_for_what_cannot_spread():
    from tasks.common.specs import TrainSpec
    from tasks.train.plan import check_allocation, plan_world

    with pytest.raises(UserError, match=r"^--hosts 2 runs inside a SLURM allocation of 2 nodes \(infra/slurm-train.sbatch\); this process is in none$"):
        check_allocation(2, {})
    with pytest.raises(UserError, match=r"^--hosts 4 exceeds the 2 nodes of SLURM job 9$"):
        check_allocation(4, {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2"})
    check_allocation(2, {"SLURM_JOB_ID": "9", "SLURM_NNODES": "3"})
    for fields, message in (({"world_size": 3}, "needs --world-size, a multiple of 2"), ({"framework": "jax", "world_size": 2}, "torch or tensorflow"),
                            ({"framework": "tensorflow", "strategy": "mirrored", "world_size": 4}, "strategy multiworker")):
        with pytest.raises(ValueError, match=message):
            TrainSpec(workload="har", hosts=2, **fields)
    assert plan_world(TrainSpec(workload="har", hosts=2, world_size=4), None) == (4, 2)  # 2 processes on each host
    assert plan_world(TrainSpec(workload="har", framework="tensorflow", hosts=2, world_size=2), None) == (2, 1)
