"""Experiment tracking on Weights & Biases: a run's config, its metric rows, its curve and videos.

``track=True`` (``vecaccel train ALGO --track``, as CleanRL spells it) opens one W&B run on
rank 0, named after the run directory, in ``wandb_project_name`` (and ``wandb_entity``). The
:class:`~vecaccel.trainers.services.logger.RunLogger` feeds it:

- ``wandb.init(config=...)``: the resolved config, the algorithm and the step budget, the same
  values TensorBoard gets as hyperparameters;
- every metric row it writes, with the keys of ``metrics.csv`` and TensorBoard, against
  ``global_step`` (the x-axis of every chart, as CleanRL's runs have it);
- ``learning_curve.png`` when the run ends, and the videos the run made (``*.mp4`` and ``*.gif``
  under the run directory, or those handed to ``RunLogger.log_video``).

The rows are sent by the logger itself rather than through ``sync_tensorboard=True``: that
option patches TensorBoard's writer for the whole process (any other ``SummaryWriter`` the
user opens would be uploaded into this run), sends nothing when TensorBoard is off
(``--no-tensorboard``) or not installed, and lags the rows by TensorBoard's flush interval.
``monitor_gym`` patches a Gymnasium video recorder that Gymnasium 1.x no longer has, and
``save_code`` would save the ``vecaccel`` console script rather than the user's code, so both are
left to wandb's own settings (``WANDB_SAVE_CODE``...). ``WANDB_MODE=offline`` keeps a run on
disk for a later ``wandb sync``.

An online run needs credentials: where wandb finds none (no ``WANDB_API_KEY``, no ``~/.netrc``
entry from ``wandb login``, no key in its settings), tracking is refused with one line before
the run starts, as wandb would only fail inside ``wandb.init``. The look sends nothing over the
network: it reads the places wandb reads, as ``wandb.init`` does before it connects.

Where wandb writes: ``WANDB_DIR`` when it is set, else the run directory (``RUN_DIR/wandb/``),
so a run's files stay together; a resumed run (``--resume``) continues the same W&B run, whose
id the run directory keeps in ``wandb-run-id``.

Example:
    >>> wandb_missing("--track") in (None, "--track needs wandb, which is not installed: "
    ...                              "pip install 'vecaccel[track]'")
    True
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "RUN_ID_FILE",
    "STEP_KEY",
    "WandbTracker",
    "hparam_value",
    "require_wandb",
    "wandb_missing",
    "wandb_not_logged_in",
]

#: the metric every chart of a tracked run is drawn against: the env steps, over all ranks
STEP_KEY = "global_step"

#: where a run directory keeps the id of its W&B run, for a resumed run to continue it
RUN_ID_FILE = "wandb-run-id"

#: what installs wandb
INSTALL = "pip install 'vecaccel[track]'"


def wandb_missing(what: str = "track=True") -> str | None:
    """The one line saying that ``what`` needs wandb and how to install it, or ``None`` when
    wandb imports.

    Args:
        what: what asked for tracking, in the caller's terms (``"--track"``, ``"track=True"``).
    """
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        if (exc.name or "wandb").split(".")[0] != "wandb":
            # wandb is there but one of its own imports fails: say which
            return f"{what} needs wandb, which cannot be imported ({exc}): {INSTALL}"
        return f"{what} needs wandb, which is not installed: {INSTALL}"
    return None


def wandb_not_logged_in(what: str = "track=True") -> str | None:
    """The one line saying that ``what`` would log to W&B online with no credentials and how to
    give some, or ``None`` when wandb finds credentials or does not go online
    (``WANDB_MODE=offline`` or ``disabled``). Sends nothing over the network.

    Args:
        what: what asked for tracking, in the caller's terms (``"--track"``, ``"track=True"``).

    Raises:
        ModuleNotFoundError: wandb cannot be imported (see :func:`wandb_missing`).
    """
    import wandb

    try:
        if _wandb_logged_in(wandb):
            return None
    except wandb.errors.AuthenticationError as exc:  # a key in a form wandb refuses
        return f"{what}: wandb cannot use the credentials it found: {exc}"
    return (
        f"{what} logs to W&B online, but wandb finds no login on this machine: run "
        "`wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline to keep the run on disk "
        "(`wandb sync` uploads it later)"
    )


def _wandb_logged_in(wandb: ModuleType) -> bool:
    """Whether a run ``wandb.init`` starts now has credentials or needs none. wandb looks, in
    order, at its mode setting, the current login, ``WANDB_API_KEY`` (or
    ``WANDB_IDENTITY_TOKEN_FILE``), the ``.netrc`` entry of its host and the key in its settings
    files; this reads the same places and prompts for, stores and verifies nothing."""
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # releases before wbauth: wandb.api reads the same places
        mode = os.environ.get("WANDB_MODE", "online")
        return mode in ("offline", "dryrun", "disabled") or bool(wandb.api.api_key)
    settings = wandb_setup.singleton().settings
    if settings.mode in ("offline", "dryrun", "disabled"):
        return True
    look = wbauth.authenticate_session
    if not {"prompt", "update_session", "verify"} <= set(inspect.signature(look).parameters):
        return bool(wandb.api.api_key)
    found = look(
        host=settings.base_url,
        source="vecaccel",
        prompt=False,
        verify=False,
        update_session=False,
    )
    return found is not None


def require_wandb(what: str = "track=True") -> ModuleType:
    """``wandb``, imported, with credentials for an online run.

    Raises:
        ModuleNotFoundError: (an ``ImportError``) naming ``what`` and ``pip install
            'vecaccel[track]'`` when wandb cannot be imported.
        RuntimeError: the run would go online and wandb finds no credentials (see
            :func:`wandb_not_logged_in`).
    """
    missing = wandb_missing(what)
    if missing is not None:
        raise ModuleNotFoundError(missing, name="wandb")
    import wandb

    not_logged_in = wandb_not_logged_in(what)
    if not_logged_in is not None:
        raise RuntimeError(not_logged_in)
    return wandb


def hparam_value(value: Any) -> int | float | str:
    """A config value as a hyperparameter TensorBoard's HPARAMS tab can show: numbers and
    strings as they are, anything else (booleans, ``None``, dicts, tuples) as its ``repr``.

    Booleans are written as ``"True"``/``"False"``: ``torch.utils.tensorboard``'s ``hparams``
    takes a ``bool`` for the number 1.0 or 0.0.

    Example:
        >>> [hparam_value(v) for v in (3, 0.5, True, "shm", None, (64, 64))]
        [3, 0.5, 'True', 'shm', 'None', '(64, 64)']
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return float(value)
    return repr(value)


class WandbTracker:
    """One W&B run that a :class:`~vecaccel.trainers.services.logger.RunLogger` feeds.

    Opened on rank 0 only (the logger of another rank has none). Every :meth:`log` is one
    ``wandb.log`` row carrying ``global_step``, which every chart is drawn against.

    Args:
        config: the run's resolved settings (``wandb.init(config=...)``).
        project: the W&B project (``wandb_project_name``).
        entity: the W&B team or user (``wandb_entity``; ``None``: the default of the login).
        run_dir: the run directory: the run's name, where wandb writes (unless ``WANDB_DIR``
            is set), and where the W&B run id is kept.
        resume: continue the W&B run this run directory recorded (a resumed run), if any.

    Raises:
        ModuleNotFoundError: wandb is not installed (the message names ``pip install
            'vecaccel[track]'``).
        RuntimeError: the run would go online and wandb finds no credentials.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        project: str,
        entity: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        resume: bool = False,
    ) -> None:
        wandb = require_wandb()
        self._wandb = wandb
        self.run_dir = None if run_dir is None else Path(run_dir)
        run_id = self._recorded_id() if resume else None
        options: dict[str, Any] = {}
        if self.run_dir is not None and not os.environ.get("WANDB_DIR"):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            options["dir"] = str(self.run_dir)
        if run_id is not None:
            options.update(id=run_id, resume="allow")
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=None if self.run_dir is None else self.run_dir.resolve().name,
            config=dict(config),
            job_type="train",
            **options,
        )
        # global_step is the x-axis of every metric: a resumed run that drops the rows written
        # after its last checkpoint logs lower steps again, which wandb's own step refuses
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        if self.run_dir is not None:
            (self.run_dir / RUN_ID_FILE).write_text(f"{self.run.id}\n")
        self._sent_media: set[Path] = set()
        self._finished = False

    def _recorded_id(self) -> str | None:
        if self.run_dir is None:
            return None
        try:
            run_id = (self.run_dir / RUN_ID_FILE).read_text().strip()
        except OSError:
            return None
        return run_id or None

    @property
    def run_id(self) -> str:
        """The W&B run's id."""
        return str(self.run.id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Send one metric row at env step ``step``."""
        if metrics:
            self.run.log({**metrics, STEP_KEY: int(step)})

    def log_image(self, key: str, path: str | os.PathLike[str], step: int) -> None:
        """Send the image file at ``path`` under ``key`` at env step ``step``."""
        self.run.log({key: self._wandb.Image(str(path)), STEP_KEY: int(step)})
        self._sent_media.add(Path(path).resolve())

    def log_video(self, key: str, path: str | os.PathLike[str], step: int) -> None:
        """Send the video file (``.mp4``, ``.gif``, ``.webm``, ``.ogg``) at ``path`` under
        ``key`` at env step ``step``; a file already sent is not sent again."""
        resolved = Path(path).resolve()
        if resolved in self._sent_media:
            return
        self.run.log({key: self._wandb.Video(str(path)), STEP_KEY: int(step)})
        self._sent_media.add(resolved)

    def finish(self, failed: bool = False) -> None:
        """End the W&B run (``failed``: marked as such, with exit code 1); once."""
        if self._finished:
            return
        self._finished = True
        self.run.finish(exit_code=1 if failed else 0)
