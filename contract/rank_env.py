"""The environment and files a rank process is started with.

The orchestrator writes them into each rank's launch (see orchestrator/launch/plan.py),
the agent adds its own pid and the standby flag, and the rank program reads them.
"""

from __future__ import annotations

# MLX's own launch variables (what `mlx.launch` sets).
RANK = "MLX_RANK"
HOSTFILE = "MLX_HOSTFILE"  # ring: JSON [["ip:port"], ...], one list per rank
JACCL_COORDINATOR = "MLX_JACCL_COORDINATOR"  # jaccl: rank 0's ip:port
IBV_DEVICES = "MLX_IBV_DEVICES"  # jaccl: JSON matrix of RDMA device names, null on the diagonal
# jaccl: present = prefer the device file's ring (rank i to i±1) to a mesh; set for [[links]].
JACCL_RING = "MLX_JACCL_RING"
# Never set by us: MLX's docs say it can deadlock and wedge the GPU, best left unset.
METAL_FAST_SYNCH = "MLX_METAL_FAST_SYNCH"

# huggingface_hub's: ranks load the node's directory and never reach the hub (the head
# pulls once, `sync` copies), so N nodes never race to download.
HF_HUB_OFFLINE = "HF_HUB_OFFLINE"

# Ours. Every process of one launch carries its launch id: logs, ListRanks and Reap use it.
LAUNCH_ID = "MLX_LAUNCH_ID"
AGENT_PID = "MLX_AGENT_PID"  # the agent that started the rank (macOS ranks watch it)
# A standby rank does its slow start-up, then waits for STANDBY_GO on stdin.
STANDBY = "ORCHESTRATOR_STANDBY"
STANDBY_GO = "go"
# Fault injection for tests (serving/faults.py): a spec, or a file holding more of them
# (read when the rank starts, so a test can change the faults between launches).
FAULT = "ORCHESTRATOR_FAULT"
FAULT_FILE = "ORCHESTRATOR_FAULT_FILE"
# "reference": do not load an optimized BLAS on Linux (serving/blas.py), e.g. to compare.
BLAS = "ORCHESTRATOR_BLAS"
# How many ranks of the launch run on this rank's machine (nodes with one kernel boot_id,
# e.g. network namespaces), so they split its cores (serving/blas.py) and its memory (the
# prefix cache's default bound, serving/rank/startup.py).
RANKS_ON_MACHINE = "ORCHESTRATOR_RANKS_ON_MACHINE"
# Test aid: rank 0 makes every completion emit exactly this text (then EOS), whatever the
# model says, through the real sampling path (e.g. a tiny model "calling" a tool).
FORCED_OUTPUT = "ORCHESTRATOR_FORCED_OUTPUT"

# What the orchestrator sets for each rank; a node's [nodes.env] may not override them.
RESERVED = frozenset({RANK, HOSTFILE, JACCL_COORDINATOR, IBV_DEVICES, LAUNCH_ID, AGENT_PID})

# Files written into each rank's working directory before it starts.
SETTINGS_FILE = "settings.json"
HOSTFILE_NAME = "hostfile.json"
DEVICES_FILE = "ibv_devices.json"
LOG_FILE = "rank.log"
