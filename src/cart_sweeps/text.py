"""Words in messages: a count with its noun in the right number."""


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`, `0 runs`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def duration(hours: float) -> str:
    """A time in the unit that reads best: 3 days, 5.2 hours, 14 min, 9 s."""
    if hours >= 48:
        return f"{hours / 24:,.0f} days"
    if hours >= 1:
        return f"{hours:,.1f} hours"
    return f"{hours * 60:.0f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"
