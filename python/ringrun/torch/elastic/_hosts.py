"""The launcher's count of host changes, as this rank sees it.

ringrun.membership_epoch() is an int that the launcher increases each time the job's host set
changes (0 if it never did). Ranks may see a change at different moments: State's
check_host_updates makes the decision with every rank (an allreduce of this value).
"""
import ringrun


def membership_epoch():
    """ringrun.membership_epoch(): the epoch received with this rank's last join."""
    return int(ringrun.membership_epoch())
