"""Video frames of any renderer, written and read back, and MuJoCo's headless OpenGL choice."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

from vecaccel.trainers.services.video import channel_palette, to_video_frame, write_video


def _minatar_env(render_mode: str) -> gym.Env:
    pytest.importorskip("minatar")
    from vecaccel.manager import register_envs

    register_envs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # -v1 "out of date" beside -v0; the checker's render notes
        env = gym.make("MinAtar/Breakout-v1", render_mode=render_mode)
        env.reset(seed=3)
        for action in (1, 1, 2):
            env.step(action)
    return env


def _render(env: gym.Env) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(env.render())


def test_a_minatar_frame_becomes_a_visible_uint8_image():
    env = _minatar_env("rgb_array")
    raw = _render(env)
    env.close()
    assert raw.dtype == np.float64 and raw.shape == (10, 10, 3) and raw.max() <= 1.0
    frame = to_video_frame(raw)
    assert frame.dtype == np.uint8 and frame.shape == (160, 160, 3)
    # not black: the paddle, the ball and the bricks are drawn in their colours
    assert frame.max() > 150 and len(np.unique(frame.reshape(-1, 3), axis=0)) >= 3
    # each cell is a 16x16 block of the cell's colour on 0..255
    blocks = frame.reshape(10, 16, 10, 16, 3)
    assert (blocks == blocks[:, :1, :, :1]).all()
    np.testing.assert_array_equal(blocks[:, 0, :, 0], np.rint(raw * 255).astype(np.uint8))


def test_a_channel_grid_is_drawn_in_minatars_own_colours():
    """MinAtar's boolean ``array`` render (one channel per kind of object) comes out as its
    ``rgb_array`` render does, whose cubehelix palette seaborn computes."""
    grid_env, rgb_env = _minatar_env("array"), _minatar_env("rgb_array")
    grid, rgb = _render(grid_env), _render(rgb_env)
    grid_env.close(), rgb_env.close()
    assert grid.dtype == np.bool_ and grid.shape == (10, 10, 4)
    drawn, reference = to_video_frame(grid), to_video_frame(rgb)
    assert drawn.shape == reference.shape == (160, 160, 3)
    assert np.abs(drawn.astype(int) - reference.astype(int)).max() <= 2


def test_channels_take_distinct_colours_and_the_last_set_channel_wins():
    grid = np.zeros((2, 8, 7), dtype=bool)
    for channel in range(7):
        grid[0, channel, channel] = True
    grid[1, 0, [1, 5]] = True
    image = to_video_frame(grid, min_short_side=0)
    palette = channel_palette(7)
    assert len({tuple(colour) for colour in palette}) == 7
    np.testing.assert_array_equal(image[0, :7], palette)
    np.testing.assert_array_equal(image[1, 0], palette[5])
    assert image[0, 7].tolist() == image[1, 1].tolist() == [0, 0, 0]
    # more than 4 channels is a grid whatever the dtype (an observation cast for a network)
    assert (to_video_frame(grid.astype(np.float32), min_short_side=0) == image).all()


def test_every_image_layout_becomes_rgb_uint8():
    gray = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16
    assert (to_video_frame(gray, min_short_side=0) == gray[:, :, None]).all()
    assert to_video_frame(gray[:, :, None], min_short_side=0).shape == (4, 4, 3)
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 7
    assert to_video_frame(rgba, min_short_side=0)[0, 0].tolist() == [200, 0, 0]
    gray_alpha = np.stack([gray, np.full_like(gray, 255)], axis=-1)
    assert (to_video_frame(gray_alpha, min_short_side=0)[..., 2] == gray).all()
    # floats beyond [0, 1] are on 0..255 already; integers are clipped; NaN is black
    floats = np.array([[0.0, 100.4], [300.0, np.nan]])
    assert to_video_frame(floats, min_short_side=0)[..., 0].tolist() == [[0, 100], [255, 0]]
    ints = np.array([[-5, 20], [255, 4000]], dtype=np.int64)
    assert to_video_frame(ints, min_short_side=0)[..., 0].tolist() == [[0, 20], [255, 255]]


def test_sizes_are_scaled_by_whole_factors_and_made_even():
    atari = np.random.default_rng(0).integers(0, 256, (210, 160, 3), dtype=np.uint8)
    assert to_video_frame(atari) is not atari and (to_video_frame(atari) == atari).all()
    assert to_video_frame(np.zeros((7, 9, 3), np.uint8)).shape == (162, 208, 3)  # x23, padded
    odd = np.arange(3 * 5, dtype=np.uint8).reshape(3, 5)
    padded = to_video_frame(odd, min_short_side=0)[..., 0]
    assert (
        padded.shape == (4, 6)
        and (padded[3, :5] == odd[2]).all()
        and (padded[:3, 5] == odd[:, 4]).all()
    )
    assert to_video_frame(np.zeros((100, 400)), min_short_side=300).shape == (300, 1200, 3)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (None, "render_mode='rgb_array'"),
        (np.zeros(5), r"shape \(5,\)"),
        (np.zeros((0, 4, 3)), r"shape \(0, 4, 3\)"),
        (np.array([["a"]]), "dtype <U1"),
    ],
)
def test_a_frame_that_is_no_image_is_refused_naming_it(frame, message):
    with pytest.raises(ValueError, match=message):
        to_video_frame(frame)


def test_written_videos_hold_the_converted_frames(tmp_path):
    from moviepy import VideoFileClip

    frames = [np.zeros((10, 10, 3)) for _ in range(6)]
    for index, frame in enumerate(frames):
        frame[index, :, 0] = 1.0  # a red row moving down
    path = write_video(frames, tmp_path / "sub" / "grid.mp4", fps=10)
    clip = VideoFileClip(str(path))
    try:
        read = list(clip.iter_frames())
    finally:
        clip.close()
    assert len(read) >= 5 and read[0].shape == (160, 160, 3)
    # the lossy codec keeps the picture: the red row where it was drawn, black elsewhere
    assert read[0][8, :, 0].min() > 180 and read[0][80, :, 0].max() < 60
    with pytest.raises(ValueError, match="no frames"):
        write_video([], tmp_path / "empty.mp4", fps=10)
    with pytest.raises(ValueError, match="frame 1 is 200x200 pixels, frame 0 160x160"):
        write_video([np.zeros((10, 10)), np.zeros((200, 200))], tmp_path / "sizes.mp4", fps=10)


# -- MuJoCo's OpenGL backend without a display -------------------------------------------------

GL_VARIABLES = ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")
MISSING_LIBRARIES = "[('egl', 'vecaccel-test-no-EGL'), ('osmesa', 'vecaccel-test-no-OSMesa')]"

#: name: (the variables set, the call); each runs with only those of GL_VARIABLES set
SCENARIOS = {
    "mujoco env, no display": ({}, "video.prepare_video_recording('HalfCheetah-v5')"),
    "X11 display": ({"DISPLAY": ":0"}, "video.choose_mujoco_gl(required=True)"),
    "Wayland display": ({"WAYLAND_DISPLAY": "wayland-0"}, "video.choose_mujoco_gl(required=True)"),
    "user's MUJOCO_GL": ({"MUJOCO_GL": "glfw"}, "video.choose_mujoco_gl(required=True)"),
    "user's PYOPENGL_PLATFORM": ({"PYOPENGL_PLATFORM": "osmesa"}, "video.choose_mujoco_gl()"),
    "no library": ({}, f"video.choose_mujoco_gl(required=True, libraries={MISSING_LIBRARIES})"),
    "no library, not mujoco": ({}, f"video.choose_mujoco_gl(libraries={MISSING_LIBRARIES})"),
    "cartpole, no display": ({}, "video.prepare_video_recording('CartPole-v1')"),
}

CHOOSE = """
import json, os, sys
from vecaccel.trainers.services import video
results = {}
for name, (variables, call) in json.loads(sys.argv[1]).items():
    for key in json.loads(sys.argv[2]):
        os.environ.pop(key, None)
    os.environ.update(variables)
    try:
        chosen, error = eval(call), None
    except video.HeadlessRenderingError as exc:
        chosen, error = None, str(exc)
    results[name] = {"chosen": chosen, "error": error, "mujoco_imported": "mujoco" in sys.modules,
                     "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
                     "PYOPENGL_PLATFORM": os.environ.get("PYOPENGL_PLATFORM")}
print(json.dumps(results))
"""


def _run(code: str, *args: str) -> str:
    """The output of ``code`` run by a fresh interpreter whose environment has no display and
    no GL settings."""
    env = {key: value for key, value in os.environ.items() if key not in GL_VARIABLES}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def chosen() -> dict[str, dict]:
    """What each of :data:`SCENARIOS` chose, all run one after another in one interpreter
    with the environment variables really set."""
    if not sys.platform.startswith("linux"):
        pytest.skip("X11 and Wayland displays are Linux's")
    return json.loads(
        _run(CHOOSE, json.dumps(SCENARIOS), json.dumps(GL_VARIABLES)).splitlines()[-1]
    )


def _loads(library: str) -> bool:
    found = ctypes.util.find_library(library)
    try:
        return found is not None and ctypes.CDLL(found) is not None
    except OSError:
        return False


HEADLESS = "egl" if _loads("EGL") else "osmesa" if _loads("OSMesa") else None


def test_no_display_picks_egl_else_osmesa_before_mujoco_loads(chosen):
    result = chosen["mujoco env, no display"]
    if HEADLESS is None:
        assert "apt install libegl1" in result["error"] and "MUJOCO_GL=osmesa" in result["error"]
    else:
        assert result["error"] is None and result["chosen"] == result["MUJOCO_GL"] == HEADLESS
        assert result["PYOPENGL_PLATFORM"] == HEADLESS
    assert result["mujoco_imported"] is False


def test_a_display_or_the_users_setting_is_left_alone(chosen):
    for name in ("X11 display", "Wayland display"):
        assert chosen[name]["chosen"] is chosen[name]["MUJOCO_GL"] is None
        assert chosen[name]["PYOPENGL_PLATFORM"] is None
    kept = chosen["user's MUJOCO_GL"]
    assert kept["chosen"] == kept["MUJOCO_GL"] == "glfw" and kept["PYOPENGL_PLATFORM"] is None


def test_a_pyopengl_platform_set_by_the_user_is_the_choice(chosen):
    result = chosen["user's PYOPENGL_PLATFORM"]
    expected = "osmesa" if _loads("OSMesa") else None
    assert result["chosen"] == result["MUJOCO_GL"] == expected
    assert result["PYOPENGL_PLATFORM"] == "osmesa"


def test_no_headless_library_is_an_error_only_for_a_mujoco_env(chosen):
    error = chosen["no library"]["error"]
    assert chosen["no library"]["MUJOCO_GL"] is None
    assert "no display (DISPLAY and WAYLAND_DISPLAY are unset)" in error
    assert "MUJOCO_GL=egl" in error and "libvecaccel-test-no-OSMesa" in error
    assert chosen["no library, not mujoco"] == {**chosen["no library"], "error": None}
    # an env that does not render with MuJoCo gets the headless backend all the same, unasked
    cartpole = chosen["cartpole, no display"]
    assert cartpole["error"] is None and cartpole["MUJOCO_GL"] == HEADLESS


RENDER_MUJOCO = """
import json
from vecaccel.trainers.services import video
video.prepare_video_recording("InvertedPendulum-v5")
import gymnasium as gym
env = gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=64, height=64)
env.reset(seed=0)
frame = video.to_video_frame(env.render())
env.close()
colours = len({tuple(pixel) for pixel in frame.reshape(-1, 3).tolist()})
print(json.dumps({"shape": list(frame.shape), "dtype": frame.dtype.name, "colours": colours}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11 and Wayland are Linux's")
def test_a_mujoco_env_renders_without_a_display():
    pytest.importorskip("mujoco")
    result = json.loads(_run(RENDER_MUJOCO).splitlines()[-1])
    # 64 pixels enlarged by the least whole factor that reaches 160: 3
    assert (result["shape"], result["dtype"]) == ([192, 192, 3], "uint8")
    assert result["colours"] > 10  # a drawn scene, not a blank frame


def test_recording_without_moviepy_says_what_to_install():
    code = (
        "import sys\n"
        "sys.modules['moviepy'] = None  # as if it were not installed\n"
        "from vecaccel.trainers.services import video\n"
        "try:\n"
        "    video.prepare_video_recording('CartPole-v1')\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    assert _run(code).splitlines()[-1] == (
        "recording a video needs moviepy, which is not installed: pip install moviepy"
    )
