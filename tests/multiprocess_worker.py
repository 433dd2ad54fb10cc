"""One process of a multi-process run (2 forced CPU devices each); started by test_multiprocess*.py.

python multiprocess_worker.py ADDRESS PROCESS_ID RUN_DIR [key=value ...]   (overrides, e.g. num_steps=5)

ADDRESS "cluster": no coordinator settings; the process finds its job in the launcher's variables (SLURM's).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

from helpers import DistributedCartpoleTask, distributed_cartpole_config

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from ksim.config import parse_overrides

if __name__ == "__main__":
    address, process_id, run_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    joining = (
        {} if address == "cluster" else {"coordinator_address": address, "num_processes": 2, "process_id": process_id}
    )
    config = distributed_cartpole_config(**joining, run_dir=run_dir, num_steps=3)
    task = DistributedCartpoleTask(parse_overrides(config, sys.argv[4:]))
    import jax

    assert task.num_devices == 4 and task.envs_per_device == 2 and jax.process_index() == process_id
    state = task.run()
    assert task.replica_divergences(state) == []
    print(f"process {process_id} done", flush=True)
