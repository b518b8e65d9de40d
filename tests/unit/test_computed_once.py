"""``computed_once``: a frozen instance's derived value, computed on its first read only."""

from __future__ import annotations

from dataclasses import dataclass, field

from compaction_proxy.computed_once import computed_once


@dataclass(frozen=True)
class Counted:
    text: str
    computations: list[str] = field(default_factory=list, compare=False)

    @computed_once
    def shouted(self) -> str:
        """The text, louder."""
        self.computations.append(self.text)
        return self.text.upper()


def test_a_frozen_instance_computes_its_value_on_the_first_read_alone() -> None:
    counted = Counted("hi")
    assert (counted.shouted, counted.shouted) == ("HI", "HI")
    assert counted.computations == ["hi"]
    assert Counted("other").shouted == "OTHER"  # every instance its own


def test_the_class_holds_the_descriptor_with_its_documentation() -> None:
    assert isinstance(Counted.shouted, computed_once)
    assert Counted.shouted.__doc__ == "The text, louder."
