"""The launcher's count of host changes, as this rank sees it.

ringrun.membership_epoch() is an int that the launcher increases each time the job's host set
changes (0 if it never did). Ranks may see a change at different moments: State's
check_host_updates makes the decision with every rank (an allreduce of this value).
"""
import ringrun


def membership_epoch():
    """ringrun.membership_epoch(), or 0 where the runtime does not provide it: then no host
    change is ever seen, and only failures re-form the job."""
    read = getattr(ringrun, "membership_epoch", None)
    return 0 if read is None else int(read())
