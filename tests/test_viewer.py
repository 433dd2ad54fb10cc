"""mode=view: the viewer's page in a real browser (Debian's headless Chromium), its controls and its refusals."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import jax
import mujoco
import numpy as np
import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, TorqueActuators
from ksim.engine import ModelLayout
from ksim.geom_mesh import box_mesh, capsule_mesh, cylinder_mesh, geom_mesh
from ksim.modes.view import Settings as ViewMode
from ksim.modes.view import make_viewer
from ksim.resets import Reset
from ksim.task.ppo import PPOConfig, PPOTask
from ksim.viewer_settings import command_ranges

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
PAGE_TIMEOUT_S = 90.0
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no Chromium and chromedriver on this machine (apt-get install chromium chromium-driver; .ci/run does)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = PAGE_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def viewer() -> Iterator[Any]:
    """The cartpole's initial policy in a viewer, stepping on a thread (one compile for the module)."""
    task = CartpoleTask(cartpole_config(mode="view"))
    viewer = make_viewer(task, ViewMode(view_port=free_port()))
    viewer.panel.speed.value = 0.25  # fewer scene updates for the browser's software WebGL to draw
    stop = threading.Event()
    thread = threading.Thread(target=viewer.run, args=(stop,), daemon=True)
    thread.start()
    yield viewer, thread
    stop.set()
    thread.join(timeout=10)
    viewer.close()


def warm_pixels(png: bytes, panel_fraction: float = 0.3) -> int:
    """Pixels of the cart-pole's wood colors (red over green over blue) left of the control panel."""
    from io import BytesIO

    from PIL import Image

    image = np.asarray(Image.open(BytesIO(png)).convert("RGB")).astype(int)
    scene = image[:, : int(image.shape[1] * (1 - panel_fraction))]
    r, g, b = scene[..., 0], scene[..., 1], scene[..., 2]
    return int(np.sum((r > g) & (g > b) & (r - b > 60)))


@contextlib.contextmanager
def chromium(url: str) -> Iterator[Any]:
    """A headless Chromium (selenium driver) showing `url`, quit on leaving."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=800,600"):
        options.add_argument(argument)
    options.add_argument("--enable-unsafe-swiftshader")  # WebGL in software: CI machines have no GPU
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(url)
        yield driver
    finally:
        driver.quit()


@needs_chromium
def test_browser_shows_the_robot_and_reset_restarts_the_episode(viewer: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    view, thread = viewer
    with chromium(view.url) as driver:

        def reset_button() -> Any:
            buttons = [b for b in driver.find_elements(By.TAG_NAME, "button") if b.text == "Reset"]
            return buttons[0] if buttons else None

        wait_for(reset_button, "the control panel's Reset button")

        def robot_drawn() -> bytes | None:
            png = driver.get_screenshot_as_png()
            return png if warm_pixels(png) > 150 else None

        screenshot = wait_for(robot_drawn, "the cart and pole drawn in the page")
        (tmp_path / "viewer.png").write_bytes(screenshot)

        draws = view.sim._draws
        reset_button().click()
        wait_for(lambda: view.resets == 1, "the simulation to restart its episode")
        assert view.sim._draws > draws
        wait_for(lambda: "Resets 1" in driver.find_element(By.TAG_NAME, "body").text, "the page to report the reset")
    steps = view.steps  # the browser has gone: the simulation runs on
    wait_for(lambda: view.steps > steps, "steps after the browser left", timeout_s=20)
    reconnect_and_leave(view.url.replace("http://", "ws://"))  # a browser coming back is served the scene
    steps = view.steps
    wait_for(lambda: view.steps > steps, "steps after a second visit", timeout_s=20)
    assert thread.is_alive()


def reconnect_and_leave(ws_url: str) -> None:
    """Connects to the viewer's websocket as a page does, takes its first message, and hangs up."""
    import viser
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    with connect(ws_url, subprotocols=[Subprotocol(f"viser-v{viser.__version__}")], open_timeout=30) as page:
        assert page.recv(timeout=30)  # the scene's first message


# A red box floating free (no gravity, no contacts) that glides along world x at GLIDE_SPEED from the start
# of each episode, whatever the policy does (its one motor turns a weightless tab): a base that moves by
# construction, as a trained robot's walks.
GLIDER_XML = """
<mujoco>
  <option timestep="0.01" iterations="1" ls_iterations="1" gravity="0 0 0"><flag contact="disable"/></option>
  <worldbody>
    <geom name="floor" type="plane" size="50 50 0.1" rgba="0.5 0.5 0.55 1"/>
    <body name="glider" pos="0 0 0.3">
      <freejoint name="root"/>
      <geom type="box" size="0.2 0.12 0.08" rgba="1 0 0 1" mass="1"/>
      <body name="tab"><joint name="tab" type="hinge" axis="0 0 1"/><geom type="sphere" size="0.01" mass="1e-3"/></body>
    </body>
  </worldbody>
  <actuator><motor joint="tab" gear="1e-9" ctrlrange="-1 1"/></actuator>
</mujoco>"""
GLIDE_SPEED = 2.0  # m/s


@dataclasses.dataclass(frozen=True)
class Glide(Reset):
    def apply(self, qpos: jax.Array, qvel: jax.Array, layout: ModelLayout, rng: jax.Array) -> tuple:
        return qpos, qvel.at[0].set(GLIDE_SPEED)


class GliderTask(PPOTask[PPOConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(GLIDER_XML)

    def get_observations(self) -> Sequence[obs.Observation]:
        return [obs.BaseLinearVelocity()]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [rew.StayAlive(scale=1.0)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return []

    def get_resets(self) -> Sequence[Reset]:
        return [Glide()]

    def get_actuators(self) -> Actuators:
        return TorqueActuators.from_model(self.engine.mj_model)


def red_pixels(png: bytes) -> tuple[int, np.ndarray]:
    """The red box's pixels: their count and their centroid's offset from the frame's centre (fractions of it)."""
    from PIL import Image

    image = np.asarray(Image.open(BytesIO(png)).convert("RGB")).astype(int)
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    red = (r > 100) & (g < 0.6 * r) & (b < 0.6 * r) & (abs(g - b) < 50)  # not the orange of the page's notices
    red[int(0.8 * red.shape[0]) :, : int(0.08 * red.shape[1])] = False  # the axes gizmo, bottom left
    rows, columns = np.nonzero(red)
    if not len(rows):
        return 0, np.full(2, np.inf)
    return len(rows), np.asarray([columns.mean() / red.shape[1], rows.mean() / red.shape[0]]) - 0.5


def still_screenshot(driver: Any) -> bytes:
    """A screenshot once the page has drawn all it was sent (two in a row alike; the simulation paused)."""
    shots = [driver.get_screenshot_as_png()]

    def settled() -> bool:
        shots.append(driver.get_screenshot_as_png())
        return shots[-1] == shots[-2]

    wait_for(settled, "the page to stop changing")
    return shots[-1]


def glide(view: Any, metres: float) -> None:
    """Plays until the base has moved `metres` along x, then pauses."""
    start = float(view.scene.base_pos[0])
    view.panel.playing.value = True
    wait_for(lambda: view.scene.base_pos[0] - start >= metres, f"the base to glide {metres} m")
    view.panel.playing.value = False


@needs_chromium
def test_camera_following_the_base_keeps_a_moving_robot_in_view(tmp_path: Path) -> None:
    config = PPOConfig(
        num_envs=4,
        batch_size=4,
        rollout_length_frames=4,
        actor_hidden=[8],
        critic_hidden=[8],
        ctrl_dt=0.02,
        dt=0.01,
        episode_length_s=100.0,
        mode="view",
    )
    view = make_viewer(GliderTask(config), ViewMode(view_port=free_port()))
    view.panel.playing.value = False
    stop = threading.Event()
    thread = threading.Thread(target=view.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with chromium(view.url) as driver:
            wait_for(lambda: red_pixels(driver.get_screenshot_as_png())[0] > 0, "the red box drawn in the page")
            start_png = still_screenshot(driver)
            (tmp_path / "start.png").write_bytes(start_png)
            start_count, start_offset = red_pixels(start_png)
            assert start_count > 300 and np.all(np.abs(start_offset) < 0.1), (start_count, start_offset)

            glide(view, 8.0)  # followed: drawn where it started, as large
            followed_png = still_screenshot(driver)
            (tmp_path / "followed.png").write_bytes(followed_png)
            count, offset = red_pixels(followed_png)
            assert count > 0.7 * start_count and np.all(np.abs(offset) < 0.1), (start_count, count, offset)

            view.panel.follow.value = False
            glide(view, 4.0)  # unfollowed, half as far: out of the frame
            # Polled rather than one settled screenshot: on a loaded CPU the page can hold still for two
            # screenshots before it draws the last scene update.
            wait_for(
                lambda: red_pixels(driver.get_screenshot_as_png())[0] < 0.05 * start_count,
                "the unfollowed robot to leave the frame",
            )
    finally:
        stop.set()
        thread.join(timeout=10)
        view.close()


def test_port_in_use_is_refused_before_compiling(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            CartpoleTask.launch(cartpole_config(), ["mode=view", f"view_port={port}"])
    assert exit_info.value.code == 2
    assert f"view_port={port} is in use by another program; choose another with view_port=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argument", "message"),
    [("view_port=70000", "view_port=70000 must be a TCP port"), ("geom_groups=[0,6]", "geom_groups=[0, 6] may hold")],
)
def test_bad_view_settings_are_refused(argument: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        CartpoleTask.launch(cartpole_config(), ["mode=view", argument])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def outward(mesh: Any) -> bool:
    """Every face's normal points away from the mesh's center (the side a renderer draws)."""
    corners = mesh.vertices[mesh.faces]
    normals = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    return bool(np.all(np.sum(normals * corners.mean(axis=1), axis=1) > 0))


def test_geom_meshes_have_the_model_sizes_and_face_outward() -> None:
    box = box_mesh(np.asarray([0.2, 0.1, 0.05]))
    capsule, cylinder = capsule_mesh(0.1, 0.3), cylinder_mesh(0.1, 0.3)
    np.testing.assert_allclose(box.vertices.max(axis=0), [0.2, 0.1, 0.05])
    np.testing.assert_allclose(capsule.vertices.max(axis=0), [0.1, 0.1, 0.4], atol=1e-6)
    np.testing.assert_allclose(cylinder.vertices.max(axis=0), [0.1, 0.1, 0.3], atol=1e-6)
    assert outward(box) and outward(capsule) and outward(cylinder)


def test_every_example_geom_has_a_mesh() -> None:
    for name in ("cartpole", "hopper", "quadruped", "humanoid"):
        model = mujoco.MjModel.from_xml_path(str(Path("ksim/assets") / f"{name}.xml"))
        missing = [g for g in range(model.ngeom) if geom_mesh(model, g) is None]
        assert not missing, f"{name}: geoms {missing} have no mesh"


def test_velocity_command_sliders_use_the_commands_ranges() -> None:
    from ksim.commands import VelocityCommand

    ranges = command_ranges(VelocityCommand(forward=(-1.0, 2.0)))
    assert ranges[0] == ("forward (m/s)", -1.0, 2.0)
    assert [label for label, _, _ in ranges] == ["forward (m/s)", "lateral (m/s)", "yaw rate (rad/s)"]
