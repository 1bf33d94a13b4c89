"""Out-of-sample validation of the cost model's calibration: fit the `FITTED` parameters on one set of measured
points, predict another set without refitting, and report both errors (`make bench` prints them for the kernel
registry's single kernels and the reference design's modules, each way round)."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.hw import cost


@dataclass(frozen=True)
class Validation:
    trained_on: str
    predicted: str
    params: cost.CostParams
    fit_errors: list          # cost.errors on the training points (in sample)
    test_errors: list         # cost.errors on the held-out points (out of sample)

    @staticmethod
    def _stats(errs) -> tuple[float, float]:
        a = [abs(e) for *_, e in errs]
        return (sum(a) / len(a), max(a)) if a else (0.0, 0.0)

    @property
    def fit_mean_max(self) -> tuple[float, float]:
        return self._stats(self.fit_errors)

    @property
    def test_mean_max(self) -> tuple[float, float]:
        return self._stats(self.test_errors)

    def line(self) -> str:
        (fm, fx), (tm, tx) = self.fit_mean_max, self.test_mean_max
        return (f"fit on {self.trained_on} ({len(self.fit_errors)} points, |error| mean {fm * 100:.0f}% max "
                f"{fx * 100:.0f}%) -> predict {self.predicted} ({len(self.test_errors)} points, not refitted): "
                f"|error| mean {tm * 100:.0f}%, max {tx * 100:.0f}%")


def validate(train: list, test: list, train_name: str, test_name: str, start: cost.CostParams = cost.PARAMS,
             names: tuple[str, ...] = cost.FITTED) -> Validation:
    if not train or not test:
        raise ValueError("validate: both the training and the held-out point sets must be non-empty")
    fitted = cost.calibrate(list(train), start, names)
    return Validation(train_name, test_name, fitted, cost.errors(train, fitted), cost.errors(test, fitted))


def both_ways(a: list, b: list, a_name: str, b_name: str, start: cost.CostParams = cost.PARAMS,
              names: tuple[str, ...] = cost.FITTED) -> tuple[Validation, Validation]:
    """Fit on a, predict b; fit on b, predict a."""
    return validate(a, b, a_name, b_name, start, names), validate(b, a, b_name, a_name, start, names)
