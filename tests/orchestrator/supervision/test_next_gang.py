"""Which gang launches next, and when the standby ranks start (no loop, fake gangs)."""

from __future__ import annotations

from orchestrator.supervision.next_gang import NextGang, standby_due
from orchestrator.supervision.progress import ServingSample


class Launch:
    """Stands for a Gang: a launch id, and whether its standbys were started."""

    def __init__(self, launch_id: str) -> None:
        self.launch_id = launch_id
        self.standby_started = False

    async def start_standby(self) -> None:
        self.standby_started = True


def source(standby_ranks: bool = True) -> tuple[NextGang, list[Launch]]:
    made: list[Launch] = []

    def new() -> Launch:
        made.append(Launch(f"L{len(made) + 1}"))
        return made[-1]

    return NextGang(new, standby_ranks), made  # type: ignore[arg-type]


def test_standbys_start_when_idle_for_3_s_or_after_60_s_of_load() -> None:
    """Idle (nothing running or waiting) from 3 s of ready; busy or unknown only from 60 s."""
    idle, busy = ServingSample(running=0, waiting=0), ServingSample(running=1, waiting=0)
    queued = ServingSample(running=0, waiting=2)
    assert not standby_due(idle, 2.9) and standby_due(idle, 3.0)
    for sample in (busy, queued, None):
        assert not standby_due(sample, 59.9) and standby_due(sample, 60.0)


async def test_the_adopted_gang_first_then_the_standby_then_a_new_one() -> None:
    """adopt() wins once; a started standby is the next launch; then new launches."""
    nexts, made = source()
    adopted = Launch("old")
    nexts.adopt(adopted)  # type: ignore[arg-type]
    assert nexts.adopting
    await nexts.start_standby_when_due(ServingSample(), 5.0)
    assert [m.standby_started for m in made] == [True]
    assert nexts.take() is adopted and not nexts.adopting
    # The standby made while the adopted gang served was dropped with it: a new launch now.
    assert nexts.take() is made[1]
    await nexts.start_standby_when_due(ServingSample(), 5.0)
    await nexts.start_standby_when_due(ServingSample(), 5.0)  # once per gang
    assert nexts.take() is made[2] and len(made) == 3 and made[2].standby_started
    assert nexts.launch_ids == {"old", "L1", "L2", "L3"}  # every one of them is ours


async def test_a_dropped_standby_is_not_launched_and_none_start_when_off() -> None:
    """drop_standby(): the next launch is new (its ranks end with ours); standby_ranks off: none."""
    nexts, made = source()
    await nexts.start_standby_when_due(ServingSample(), 5.0)
    nexts.drop_standby()
    assert nexts.take() is made[1]
    off, made_off = source(standby_ranks=False)
    await off.start_standby_when_due(ServingSample(), 120.0)
    assert made_off == []
