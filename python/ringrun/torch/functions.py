"""Model helpers of horovod/torch/functions.py."""
import torch

import ringrun
from . import mpi_ops


def broadcast_parameters(params, root_rank):
    """Broadcasts parameters (a state_dict, named_parameters(), or a list of tensors) from
    root_rank to every rank, in place."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        params = list(params)
        if params and not isinstance(params[0], tuple):
            params = [(None, p) for p in params]
    handles = []
    for name, p in params:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(mpi_ops.broadcast_async_(t, root_rank,
                                                name=f"broadcast.{name}" if name else None))
    for h in handles:
        mpi_ops.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state (hyperparameters, momentum buffers, Adam moments,
    step counts) equal to root_rank's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer, model)
    msg = None
    if ringrun.rank() == root_rank:
        # State tensors travel on the host: unpickled CUDA tensors would be made on root's
        # device index on every rank. load_state_dict moves them to each parameter's device,
        # except "step", which the receivers move back to the device (capturable Adam).
        sd = optimizer.state_dict()
        on_device = sorted((k, n) for k, v in sd["state"].items() for n, t in v.items()
                           if torch.is_tensor(t) and t.is_cuda)
        sd = dict(sd, state={k: {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in v.items()}
                             for k, v in sd["state"].items()})
        msg = (sd, on_device)
    state, on_device = broadcast_object(msg, root_rank, name="optimizer_state")
    if ringrun.rank() != root_rank:
        # load_state_dict makes new param_group dicts and a new state dict. Horovod sets the
        # values in place, and programs rely on it: a DistributedOptimizer shares its group
        # dicts with the optimizer it wraps, so an LR scheduler made on that one would then
        # change the learning rate on the root only. Keep the old objects, with new contents.
        old_groups, old_state = optimizer.param_groups, optimizer.state
        optimizer.load_state_dict(state)
        for old, new in zip(old_groups, optimizer.param_groups):
            old.update({k: v for k, v in new.items() if k != "params"})
        new_state = optimizer.state
        old_state.clear()
        old_state.update(new_state)
        optimizer.param_groups, optimizer.state = old_groups, old_state
        params = [p for g in optimizer.param_groups for p in g["params"]]  # state_dict's ids
        for k, n in on_device:
            t = optimizer.state[params[k]][n]
            if torch.is_tensor(t) and not t.is_cuda and params[k].is_cuda:
                optimizer.state[params[k]][n] = t.to(params[k].device)


def _initialize_state(optimizer, model):
    """Horovod's initialization of an optimizer that has no state yet: every parameter that
    requires a gradient gets a zero gradient (sparse for SparseAdam, and for SGD on a sparse
    Embedding of model), and the torch optimizer steps once, on every rank (a
    DistributedOptimizer's own step would reduce). With weight decay that step moves the
    parameters, as Horovod's does."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    if getattr(type(optimizer), "_ringrun_distributed", False):
        super(type(optimizer), optimizer).step()
    else:
        optimizer.step()


def broadcast_object(obj, root_rank=0, name=None, process_set=mpi_ops.global_process_set):
    """root_rank's obj (pickled; tensors included) on every rank."""
    ps_id = mpi_ops._check_process_set(process_set, "broadcast_object")
    root = mpi_ops._ps.root_in_set(process_set, root_rank)
    with mpi_ops._engine.process_set(ps_id):
        return mpi_ops._internal(lambda: ringrun.broadcast_object(obj, root, name))


def allgather_object(obj, name=None, process_set=mpi_ops.global_process_set):
    """A list of every rank's obj (pickled), in rank order."""
    ps_id = mpi_ops._check_process_set(process_set, "allgather_object")
    with mpi_ops._engine.process_set(ps_id):
        return mpi_ops._internal(lambda: ringrun.allgather_object(obj, name))


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]
