"""ElasticSampler (horovod/torch/elastic/sampler.py): a DistributedSampler whose epoch goes on
after a reset, over the new number of ranks, from the samples not yet processed.

The epoch's order is Horovod's: range(len(dataset)) shuffled by random.Random(seed + epoch) (or
not shuffled), so a program sees the samples Horovod would show it. What is processed is kept
as (processed_num, extra): the first processed_num indices of that order, plus the indices
recorded out of order by record_indices. record_batch counts whole batches of every rank, as
Horovod's does; both forms may be mixed. A reset partitions the rest of the epoch: what is left
of the order, less the extra indices, padded to a multiple of the size with its own first
indices and dealt to the ranks in turn (rank r takes positions r, r + size, ...), so one batch
of every rank covers one contiguous stretch of it.

Ranks call record_batch in step (the same calls on every rank, as Horovod's); record_indices
may differ between ranks: TorchState's commit gathers what every rank processed (one
allgather_object) so that every rank keeps the union.
"""
import math
import random

import numpy as np
import torch.utils.data

from .. import mpi_ops


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset over the ranks and again after each reset, without the samples
    already processed in this epoch.

    As with Horovod's: put it in the TorchState, call record_batch (or record_indices) after
    each processed batch, and set_epoch at the end of each epoch (not at its start: that would
    forget what a partly processed epoch has done).

    Args:
        dataset: what is sampled (its length must not change).
        shuffle: shuffle the indices, differently each epoch (default True).
        seed: the shuffle's seed, the same on every rank (default 0).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self._prefix = 0        # the first _prefix indices of the epoch's order are processed
        self._extra = set()     # processed indices beyond the prefix (record_indices)
        self._consumed = 0      # positions of remaining_indices counted by record_batch
        self._order_key = None  # (seed, epoch, length, shuffle) of _order
        self._order = None
        self._position = None   # index -> its position in _order, made when needed
        self.reset()

    # ---- Horovod's interface ------------------------------------------------------------

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: nothing of it is processed yet; partitions it."""
        self.epoch = epoch
        self._prefix, self._extra, self._consumed = 0, set(), 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records one batch of batch_size samples on every rank as processed (batch_idx is
        not used, as in Horovod: batches are counted in the order they were dealt)."""
        self._consumed += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Records the dataset indices `indices` as processed."""
        self._extra.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch batch_idx (of batch_size) in the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    @property
    def processed_num(self):
        """How many indices at the start of the epoch's order are processed."""
        return self._normalized()[0]

    @property
    def processed_indices(self):
        """Every index processed in this epoch (a new set)."""
        prefix, extra = self._normalized()
        return set(self._epoch_order()[:prefix]) | extra

    def state_dict(self):
        """{epoch, processed_num, processed_indices}: processed_num indices at the start of the
        epoch's order, and the processed indices beyond them (usually none)."""
        prefix, extra = self._normalized()
        return dict(epoch=self.epoch, processed_num=prefix, processed_indices=set(extra))

    def load_state_dict(self, state_dict):
        """Takes state_dict() of this class, or Horovod's of either version ({epoch,
        processed_num} or {epoch, processed_indices}), and partitions what is left."""
        self.epoch = state_dict["epoch"]
        self._prefix = int(state_dict.get("processed_num", 0))
        self._extra = {int(i) for i in state_dict.get("processed_indices", ())}
        self._consumed = 0
        self.reset()

    def reset(self):
        """Partitions what is left of the epoch over the ranks of the job as it is now
        (ringrun.torch's size() and rank())."""
        self._prefix, self._extra = self._normalized()
        self._consumed = 0
        self.num_replicas = mpi_ops.size()
        self.rank = mpi_ops.rank()
        rest = self._epoch_order()[self._prefix:]
        if self._extra:
            rest = [i for i in rest if i not in self._extra]
        self.remaining_indices = rest
        self.num_samples = int(math.ceil(len(rest) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        dealt = list(self.remaining_indices)
        dealt += dealt[:self.total_size - len(dealt)]
        self.indices = dealt[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples

    # ---- what state_dict and reset share ------------------------------------------------------

    def _epoch_order(self):
        key = (self.seed, self.epoch, len(self.dataset), self.shuffle)
        if key != self._order_key:
            order = list(range(len(self.dataset)))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(order)
            self._order_key, self._order, self._position = key, order, None
        return self._order

    def _positions(self):
        if self._position is None:
            order = self._epoch_order()
            position = np.empty(len(order), np.int64)
            position[np.asarray(order, np.int64)] = np.arange(len(order), dtype=np.int64)
            self._position = position
        return self._position

    def _normalized(self):
        """(prefix, extra) describing what is processed now, extra holding only indices past
        the prefix: the batches counted since the last reset are a stretch of
        remaining_indices, which with the extra indices before its end make a longer prefix
        of the epoch's order."""
        order = self._epoch_order()
        prefix, extra = min(self._prefix, len(order)), self._extra
        done = min(self._consumed, len(self.remaining_indices))
        if not extra:
            if done:  # remaining_indices is the order from the prefix on
                prefix += done
            return prefix, set()
        position = self._positions()
        if done:
            prefix = max(prefix, int(position[self.remaining_indices[done - 1]]) + 1)
        extra = {i for i in extra if 0 <= i < len(order) and position[i] >= prefix}
        while prefix < len(order) and order[prefix] in extra:
            extra.discard(order[prefix])
            prefix += 1
        return prefix, extra

    def _merge(self, parts):
        """Makes this rank's processed indices the union of every rank's, from parts: one
        (processed_num, extra indices) per rank, as _gathered() reads them. Keeps the current
        partition (the ranks are iterating over it). Returns state_dict()."""
        mine = self._normalized()[0]
        top = max(prefix for prefix, _ in parts)
        for _, extra in parts:
            self._extra.update(extra)
        if top > mine:
            self._extra.update(self._epoch_order()[mine:top])
        return self.state_dict()

    def _gathered(self):
        """What this rank contributes to _merge: (processed_num, sorted extra indices)."""
        prefix, extra = self._normalized()
        return prefix, sorted(extra)
