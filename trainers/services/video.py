"""Videos of any env: frames made watchable, written with moviepy, rendered without a display.

Gymnasium asks ``render()`` in ``rgb_array`` mode for a ``uint8`` array of shape ``(H, W, 3)``,
but renderers return what they have: MinAtar a ``float64`` image in [0, 1] of 10x10 cells, its
``array`` mode and its observations a boolean grid of one channel per kind of object, others
gray or RGBA images. :func:`to_video_frame` turns each of these into an RGB ``uint8`` image a
person can watch, and :func:`write_video` applies it to every frame it writes.

MuJoCo draws with OpenGL, which needs a display unless ``MUJOCO_GL`` names a headless backend:
:func:`choose_mujoco_gl` picks EGL or OSMesa on a Linux machine with no display, as
dm_control's and Gymnasium's docs tell users to do by hand.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vecaccel.envs.unknown_ids import uses_mujoco

__all__ = [
    "HEADLESS_GL_LIBRARIES",
    "MIN_SHORT_SIDE",
    "HeadlessRenderingError",
    "channel_palette",
    "choose_mujoco_gl",
    "has_display",
    "prepare_video_recording",
    "to_video_frame",
    "uses_mujoco",
    "write_video",
]

#: Frames whose shorter side is below this many pixels are enlarged by a whole factor:
#: a MinAtar frame (10x10 cells) becomes 160x160 pixels, an Atari frame (210x160) stays.
MIN_SHORT_SIDE = 160

#: The headless OpenGL backends MuJoCo can render with, in the order they are tried: the
#: ``MUJOCO_GL`` value and the shared library (as ``ctypes.util.find_library`` names it) that
#: must load for it. EGL renders on a GPU (or Mesa's software EGL); OSMesa on the CPU only.
HEADLESS_GL_LIBRARIES: tuple[tuple[str, str], ...] = (("egl", "EGL"), ("osmesa", "OSMesa"))


class HeadlessRenderingError(RuntimeError):
    """MuJoCo was asked to render on a machine with no display and no headless OpenGL."""


def channel_palette(num_channels: int) -> np.ndarray:
    """One distinct RGB colour per channel of a grid, as a ``(num_channels, 3)`` ``uint8`` array.

    The colours are the cubehelix map (Green 2011; matplotlib's ``cubehelix`` with its default
    parameters) sampled at ``num_channels`` evenly spaced points strictly inside (0, 1), the
    palette MinAtar's own ``display_state`` and ``rgb_array`` renderer take from seaborn: a
    grid drawn here has the colours MinAtar's window shows. Computed without seaborn or
    matplotlib, so videos need neither.

    Example:
        >>> channel_palette(4).tolist()
        [[22, 61, 78], [84, 121, 47], [208, 126, 147], [193, 202, 243]]
    """
    if num_channels < 1:
        raise ValueError(f"a palette needs at least one channel, got {num_channels}")
    x = np.linspace(0.0, 1.0, num_channels + 2)[1:-1]
    # cubehelix with start s=0.5, rotations r=-1.5, hue h=1, gamma 1
    amplitude = x * (1.0 - x) / 2.0
    phi = 2.0 * np.pi * (0.5 / 3.0 - 1.5 * x)
    cos, sin = np.cos(phi), np.sin(phi)
    rgb = np.stack(
        [
            x + amplitude * (-0.14861 * cos + 1.78277 * sin),
            x + amplitude * (-0.29227 * cos - 0.90649 * sin),
            x + amplitude * (1.97294 * cos),
        ],
        axis=-1,
    )
    return np.rint(np.clip(rgb, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_video_frame(frame: Any, min_short_side: int = MIN_SHORT_SIDE) -> np.ndarray:
    """Turn one rendered frame into the RGB ``uint8`` image of shape ``(H, W, 3)`` a video holds.

    The frame's last axis is its channels (Gymnasium's image layout); a 2-D frame has one.

    - **Boolean frames, and frames of more than 4 channels**, are grids of one channel per kind
      of object (MinAtar's observations and ``array`` renders): each cell takes the colour of
      :func:`channel_palette` of the last channel that is nonzero there, as MinAtar's own
      display draws it, and is black where none is.
    - **Float frames** in [0, 1] (MinAtar's ``rgb_array``) are scaled to 0..255; other float
      frames are taken as 0..255 already. Integer frames are clipped to 0..255. NaN is black.
    - **1 channel** is gray, **2** gray with alpha, **3** RGB, **4** RGBA; alpha is dropped.
    - A frame whose shorter side is below ``min_short_side`` pixels is enlarged by the smallest
      whole factor that reaches it, each cell a block of equal pixels (nearest neighbour), so a
      10x10 grid is watchable; 0 keeps the size.
    - An odd height or width gets its last row or column repeated once: H.264 in the 4:2:0
      pixel format that every player reads needs even sizes.

    A ``uint8`` RGB frame of even size at least ``min_short_side`` is returned as it is.

    Args:
        frame: what ``env.render()`` returned, or an observation grid; array-like.
        min_short_side: the smallest shorter side, in pixels, that a frame is enlarged to.

    Raises:
        ValueError: ``frame`` is not a non-empty 2-D or 3-D numeric or boolean array.

    Example:
        >>> grid = np.zeros((10, 10, 4), dtype=bool)
        >>> grid[3, 5, 2] = True
        >>> image = to_video_frame(grid)
        >>> image.shape, image.dtype.name, image[3 * 16, 5 * 16].tolist()
        ((160, 160, 3), 'uint8', [208, 126, 147])
        >>> int((image.max(axis=2) > 0).sum())  # the one cell set, now 16x16 pixels
        256
        >>> to_video_frame(np.full((2, 2), 0.5), min_short_side=0).tolist()[0]
        [[128, 128, 128], [128, 128, 128]]
    """
    if frame is None:
        raise ValueError(
            "a video frame is None: the env's render() drew nothing; make the env with "
            "render_mode='rgb_array'"
        )
    array = np.asarray(frame)
    if array.ndim not in (2, 3) or array.size == 0 or not _is_numeric(array.dtype):
        raise ValueError(
            "a video frame must be a non-empty (H, W) or (H, W, C) array of numbers or "
            f"booleans; got shape {array.shape} of dtype {array.dtype}"
        )
    if array.ndim == 2:
        array = array[:, :, None]
    channels = array.shape[-1]
    if array.dtype == np.bool_ or channels > 4:
        image = _draw_channels(array)
    else:
        values = _to_uint8(array)
        if channels <= 2:
            image = np.repeat(values[:, :, :1], 3, axis=2)
        else:
            image = values[:, :, :3]
    if min_short_side < 0:
        raise ValueError(f"min_short_side must be 0 or more pixels, got {min_short_side}")
    short_side = min(image.shape[0], image.shape[1])
    if short_side < min_short_side:
        factor = math.ceil(min_short_side / short_side)
        image = np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)
    pad = ((0, image.shape[0] % 2), (0, image.shape[1] % 2), (0, 0))
    if any(after for _, after in pad):
        image = np.pad(image, pad, mode="edge")
    return np.ascontiguousarray(image)


def _is_numeric(dtype: np.dtype) -> bool:
    return (
        dtype == np.bool_ or np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)
    )


def _to_uint8(array: np.ndarray) -> np.ndarray:
    """The values of an image frame on 0..255 as ``uint8``."""
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating):
        values = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        if values.min() >= 0.0 and values.max() <= 1.0:
            values = values * 255.0
        return np.rint(np.clip(values, 0.0, 255.0)).astype(np.uint8)
    return np.clip(array, 0, 255).astype(np.uint8)


def _draw_channels(grid: np.ndarray) -> np.ndarray:
    """A grid of ``C`` channels as RGB: the colour of the last channel set in each cell."""
    channels = grid.shape[-1]
    on = grid != 0
    # 0 where no channel is set, else 1 + the index of the last channel set, as MinAtar's
    # renderer picks the colour with ``amax(state * (index + 1))``
    which = np.max(on * np.arange(1, channels + 1, dtype=np.int64), axis=-1)
    colours = np.concatenate([np.zeros((1, 3), dtype=np.uint8), channel_palette(channels)])
    return colours[which]


def write_video(frames: Iterable[Any], path: str | os.PathLike[str], fps: float) -> Path:
    """Write ``frames`` to the video file ``path`` with moviepy, each through
    :func:`to_video_frame`; returns the path.

    The format follows the suffix (``.mp4``: H.264); missing folders are made. ``fps`` is
    held to 1..60 frames per second.

    Raises:
        ValueError: no frames, a frame :func:`to_video_frame` refuses, or frames of two sizes.
    """
    from moviepy import ImageSequenceClip

    path = Path(path)
    images = [to_video_frame(frame) for frame in frames]
    if not images:
        raise ValueError(f"no frames to write to {path}")
    for index, image in enumerate(images):
        if image.shape != images[0].shape:
            raise ValueError(
                f"video frame {index} is {image.shape[1]}x{image.shape[0]} pixels, frame 0 "
                f"{images[0].shape[1]}x{images[0].shape[0]}: a video's frames share one size"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    clip = ImageSequenceClip(images, fps=max(1.0, min(float(fps), 60.0)))
    clip.write_videofile(str(path), logger=None, audio=False)
    return path


def has_display(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an X11 or Wayland display is set (``DISPLAY`` or ``WAYLAND_DISPLAY``)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def choose_mujoco_gl(
    required: bool = False, libraries: Sequence[tuple[str, str]] = HEADLESS_GL_LIBRARIES
) -> str | None:
    """Pick MuJoCo's headless OpenGL backend where there is no display; returns ``MUJOCO_GL``.

    On Linux with neither ``DISPLAY`` nor ``WAYLAND_DISPLAY`` set and ``MUJOCO_GL`` unset,
    the first backend of ``libraries`` whose library loads (EGL, else OSMesa) is written to
    ``MUJOCO_GL``, and to ``PYOPENGL_PLATFORM`` when that is unset, the variables MuJoCo and
    PyOpenGL read when they load: call this before ``mujoco`` is imported in the process that
    renders. A ``PYOPENGL_PLATFORM`` of ``egl`` or ``osmesa`` already set is taken as the
    choice, since MuJoCo refuses a ``MUJOCO_GL`` that differs from it. A ``MUJOCO_GL`` the
    user set is kept as it is, and where a display exists, or on macOS and Windows (whose
    native OpenGL needs no display server), nothing is set.

    Args:
        required: raise if no headless backend loads (the env renders with MuJoCo), rather
            than return None.
        libraries: ``(MUJOCO_GL value, library name)`` pairs to try, in order.

    Raises:
        HeadlessRenderingError: ``required`` and neither library loads; it says what to
            install and set.
    """
    chosen = os.environ.get("MUJOCO_GL")
    if chosen or not sys.platform.startswith("linux") or has_display():
        return chosen or None
    platform = os.environ.get("PYOPENGL_PLATFORM", "").lower()
    known = dict(libraries)
    if platform in known:
        candidates: Sequence[tuple[str, str]] = [(platform, known[platform])]
    else:
        candidates = libraries
    for backend, library in candidates:
        if _loads(library):
            os.environ["MUJOCO_GL"] = backend
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    if required:
        tried = ", ".join(f"{backend} (lib{library})" for backend, library in candidates)
        raise HeadlessRenderingError(
            "MuJoCo cannot render here: there is no display (DISPLAY and WAYLAND_DISPLAY are "
            f"unset), MUJOCO_GL is unset, and no headless OpenGL library loads (tried {tried}). "
            "Install EGL for a GPU or Mesa's software EGL (Debian/Ubuntu: apt install libegl1), "
            "or OSMesa for the CPU (apt install libosmesa6), then run with MUJOCO_GL=egl or "
            "MUJOCO_GL=osmesa; or run under a virtual display: xvfb-run -a vecaccel eval ..."
        )
    return None


def _loads(library: str) -> bool:
    """Whether the shared library ``library`` (``EGL``, ``OSMesa``) is found and loads."""
    found = ctypes.util.find_library(library)
    if found is None:
        return False
    try:
        ctypes.CDLL(found)
    except OSError:
        return False
    return True


def prepare_video_recording(env_id: str) -> str | None:
    """Check that a video of ``env_id`` can be written, and set up this process to draw its
    ``rgb_array`` frames with no display; returns ``MUJOCO_GL`` as :func:`choose_mujoco_gl`
    leaves it.

    Call it before the env (and so pygame or MuJoCo) is first made in this process, so a
    missing piece stops the run before its episodes are played.

    - moviepy writes the video: it must import.
    - pygame: an ``rgb_array`` renderer (Gymnasium's classic control, PettingZoo's butterfly
      envs) only draws into a surface, but ``pygame.init()`` opens SDL's video and audio
      drivers; on a machine with no display or desktop login SDL then prints ``error:
      XDG_RUNTIME_DIR is invalid`` on a run that succeeds. SDL's dummy drivers open nothing.
    - MuJoCo: :func:`choose_mujoco_gl`, required where ``env_id`` is a MuJoCo env.

    Settings the user made stay.

    Raises:
        RuntimeError: moviepy is not installed.
        HeadlessRenderingError: ``env_id`` renders with MuJoCo and no headless OpenGL loads.
    """
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "recording a video needs moviepy, which is not installed: pip install moviepy"
        ) from None
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    return choose_mujoco_gl(required=uses_mujoco(env_id))
