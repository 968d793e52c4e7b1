"""Messages from the engine workers to the app. Workers talk back only through post_message.
Textual initialises dataclass messages through Message.__post_init__."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from textual.message import Message

from specview.backend.views import RunInfo, SessionInfo, StepView


@dataclass
class LoadProgress(Message):
    text: str  # what is loading now

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress)


@dataclass
class Loaded(Message):
    info: SessionInfo
    run: RunInfo


@dataclass
class LoadFailed(Message):
    message: str  # one line, as `specview run` prints it


@dataclass
class RunStarted(Message):
    run: RunInfo


@dataclass
class StepDone(Message):
    view: StepView
    handled: threading.Event = field(default_factory=threading.Event)  # set once drawn: the next step may start


@dataclass
class StepFailed(Message):
    step: int  # index of the step that raised
    error: str


@dataclass
class EngineIdle(Message):
    """The step worker stopped (nothing queued, paused, run ended or failed)."""

    run_done: bool


@dataclass
class ProfileSaved(Message):
    path: str | None
    error: str | None = None
    final: bool = False  # saved on the way out: exit next


@dataclass
class DrafterChanged(Message):
    spec: str  # the drafter of the next steps


@dataclass
class WhatIfReady(Message):
    figures: dict | None  # specview.whatif/1 of the current run (None: this backend cannot replay)
    error: str | None = None
