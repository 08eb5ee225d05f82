"""What the hardware allows: which device each backend reduces on, and GPUs per node."""

from __future__ import annotations

from qbench.catalog.schemes import TORCH_HOOKS
from qbench.catalog.schemes.spelling import DDP
from qbench.spec.rules.candidate import Candidate
from qbench.spec.rules.methods import Rule


def natural_device(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


def torch_ddp(scheme: str, compressor: str) -> bool:
    """DDP with torch's own communication (its allreduce, which gloo runs on CUDA tensors)."""
    return scheme == DDP and compressor in TORCH_HOOKS


def device_for(backend: str, device: str, torch_ddp: bool = False) -> tuple[str, str | None]:
    """RunSpec.device ('' when it is the backend's own) and why the pair cannot run.
    ``torch_ddp``: DDP with torch's own communication, whose allreduce gloo runs on CUDA
    tensors (staged through the host), so gloo ranks may share a GPU there."""
    kind = natural_device(backend) if device == "auto" else device
    if backend == "nccl" and kind == "cpu":
        return "", "nccl reduces GPU tensors only; use device cuda (or auto) or backend gloo"
    if backend == "gloo" and kind == "cuda" and not torch_ddp:
        return "", (
            "gloo has no CUDA all-to-all for the compressed schemes; use nccl or mpi for "
            "device cuda (gloo on CUDA runs only DDP with torch's hooks: none, fp16, bf16, "
            "powersgd)"
        )
    return ("" if kind == natural_device(backend) else kind), None


def _device(c: Candidate) -> str | None:
    return device_for(c.backend, c.device, torch_ddp(c.scheme, c.compressor.name))[1]


def _placement(c: Candidate) -> str | None:
    if c.world_size is None:
        return None
    ws, nodes = c.world_size, c.nodes
    if ws % nodes:
        return f"world_size {ws} does not split evenly over nodes {nodes}"
    placed = device_for(c.backend, c.device, torch_ddp(c.scheme, c.compressor.name))[0]
    kind = placed or natural_device(c.backend)
    # gloo stages CUDA tensors through the host, so its ranks may share a GPU (LOCAL_RANK
    # modulo the GPUs: qbench.run.loops.training); NCCL refuses two ranks on one GPU
    per_node, gpus = ws // nodes, c.gpus_per_node
    if kind == "cuda" and gpus is not None and per_node > gpus and c.backend != "gloo":
        return (
            f"{per_node} ranks per node but gpus_per_node is {gpus}; each CUDA rank needs its "
            "own GPU"
        )
    return None


RULES: tuple[Rule, ...] = (_device, _placement)
