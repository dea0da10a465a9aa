"""The user's service-level objective as a signal in the set, so that rules judge against it: ``slo_tpot_seconds``
(llmdiag.toml's ``slo_tpot_seconds`` or the command's option, 50 ms by default).

A breach of the SLO is what users feel; it says nothing by itself about what limits the server. CMP001 reports the
breach; the compute verdict needs its own proof that the step is the wall (CMP008), and slow steps while the GPUs wait
(or a server process is pinned) are the host's (SCH013, SCH014, SCH006). With neither proof the verdict is unknown
(llmdiag.engine.evaluate), never healthy.
"""

from __future__ import annotations

from llmdiag.config import DEFAULT_SLO_TPOT_SECONDS, Settings
from llmdiag.errors import option
from llmdiag.model import Signal, SignalSet

# declared in probes/signals.toml (producer "slo")
SLO_SIGNALS = ("slo_tpot_seconds",)


def add_slo_signals(signals: SignalSet, settings: Settings) -> None:
    slo = settings.slo_tpot_seconds
    given = "the default" if slo == DEFAULT_SLO_TPOT_SECONDS else "given"
    signals.add(
        Signal(
            name="slo_tpot_seconds",
            kind="derived",
            unit="seconds",
            stats={"value": slo},
            source=f"the TPOT SLO, {given} ({option('slo_tpot_seconds')}, or slo_tpot_seconds in llmdiag.toml)",
        )
    )
