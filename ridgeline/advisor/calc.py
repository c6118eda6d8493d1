"""One shown computation: a named value with its formula and the numbers substituted in."""
from __future__ import annotations

from dataclasses import dataclass, field

from ridgeline.advisor.units import fmt_value


@dataclass(frozen=True)
class Step:
    key: str  # machine name, used in --json
    label: str
    formula: str
    numbers: str
    value: float
    unit: str = ""

    def text(self) -> str:
        shown = fmt_value(self.value, self.unit)
        parts = [self.formula] + ([self.numbers] if self.numbers and self.numbers != self.formula else [])
        return f"{self.label}: {shown}   [{' = '.join(parts)}]"

    def json(self) -> dict:
        return {"label": self.label, "formula": self.formula, "numbers": self.numbers,
                "value": self.value, "unit": self.unit}


@dataclass
class Section:
    key: str
    title: str
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, key: str, label: str, formula: str, numbers: str, value: float, unit: str = "") -> float:
        self.steps.append(Step(key, label, formula, numbers, value, unit))
        return value

    def note(self, text: str) -> None:
        self.notes.append(text)

    def value(self, key: str) -> float:
        return next(s.value for s in self.steps if s.key == key)

    def text(self) -> str:
        lines = [f"== {self.title} =="] + [f"  {s.text()}" for s in self.steps]
        return "\n".join(lines + [f"  - {n}" for n in self.notes])

    def json(self) -> dict:
        return {"title": self.title, "values": {s.key: s.json() for s in self.steps}, "notes": self.notes}
