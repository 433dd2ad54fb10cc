"""`mode=view`: a web page (Viser) showing a policy drive one env live, with controls to poke it.

Viser serves a three.js scene and a control panel over a websocket from this process, so it works from a
headless training machine (open the printed URL, through `ssh -L PORT:localhost:PORT` from elsewhere). The
scene is the host MuJoCo model's geoms, posed each control step from the qpos of the JAX state
(`ksim.viewer.sim.ViewerSim`); browsers may come, go and come back while the simulation runs on.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections import deque
from collections.abc import Callable

import mujoco
import numpy as np
import viser
import viser.uplot

from ksim.geom_mesh import geom_mesh, geom_rgba
from ksim.viewer.sim import StepReport, ViewerSim
from ksim.viewer_settings import ViewSettings

PLOT_STEPS = 250  # control steps of reward history in the plot
PANEL_UPDATE_S = 0.2  # the panel's numbers change at 5 Hz; the scene at every control step
BAR_WIDTH = 12
CAMERA_OFFSET = np.asarray([0.9, -1.6, 0.7])  # from the base, m: behind-right and above, as a robot video's camera
REFERENCE_COLOR = (80, 200, 120)  # the reference pose's translucent copy of the robot
REFERENCE_OPACITY = 0.35


def value_bar(value: float, scale: float) -> str:
    """`+0.53 ██████` : a signed value and a bar of its size relative to `scale`."""
    filled = round(min(abs(value) / scale, 1.0) * BAR_WIDTH) if scale > 0 else 0
    return f"`{value:+8.3f}` {'█' * filled}"


def bars_markdown(names: list[str], values: np.ndarray) -> str:
    """A table of named values with bars scaled to the largest magnitude."""
    scale = float(np.max(np.abs(values))) if len(values) else 0.0
    rows = [f"| {name} | {value_bar(float(v), scale)} |" for name, v in zip(names, values, strict=True)]
    return "\n".join(["| | |", "|---|---|", *rows])


def observation_names(layout: tuple[tuple[str, int], ...]) -> list[str]:
    """One name per observation value: the component's, with the index within it where it has several."""
    return [name if size == 1 else f"{name}[{i}]" for name, size in layout for i in range(size)]


class SceneView:
    """The model's geoms in a Viser scene, posed from a qpos with host MuJoCo kinematics.

    Following the base moves the scene under the cameras, not the cameras: a browser echoes its camera back
    late and overwrites the server's copy of it, so steps of camera motion sent from the server get lost.
    """

    def __init__(self, server: viser.ViserServer, mj_model: mujoco.MjModel, groups: tuple[int, ...]) -> None:
        self.mj_model, self.mj_data = mj_model, mujoco.MjData(mj_model)
        self.server = server
        self.handles: dict[int, viser.MeshHandle] = {}
        self.shown_groups = set(groups)
        self.world = server.scene.add_frame("/world", show_axes=False)  # every geom's parent: shifted to follow
        for geom in range(mj_model.ngeom):
            self._add_geom(geom)
        server.scene.add_light_hemisphere("/light/sky", sky_color=(255, 255, 255), ground_color=(80, 80, 90))
        server.scene.add_light_directional("/light/sun", intensity=1.5, position=(2.0, -2.0, 6.0))
        self.base_pos = np.zeros(3)
        self.reference_handles: dict[int, viser.MeshHandle] = {}
        self.reference_data = mujoco.MjData(mj_model)

    def add_reference(self) -> None:
        """A translucent copy of the robot's geoms, posed by `pose_reference`: the pose the command asks for."""
        for geom in range(self.mj_model.ngeom):
            mesh = geom_mesh(self.mj_model, geom)
            if mesh is None or self.mj_model.geom_bodyid[geom] == 0 or geom_rgba(self.mj_model, geom)[3] == 0:
                continue
            self.reference_handles[geom] = self.server.scene.add_mesh_simple(
                f"/world/reference/{geom}",
                mesh.vertices,
                mesh.faces,
                color=REFERENCE_COLOR,
                opacity=REFERENCE_OPACITY,
                visible=int(self.mj_model.geom_group[geom]) in self.shown_groups,
            )

    def pose_reference(self, qpos: np.ndarray) -> None:
        with self.server.atomic():
            self._pose_handles(self.reference_handles, self.reference_data, qpos)

    def _pose_handles(self, handles: dict[int, viser.MeshHandle], data: mujoco.MjData, qpos: np.ndarray) -> None:
        """Moves `handles`' geoms to where `qpos` puts them (inside the caller's `atomic` block)."""
        data.qpos[:] = qpos
        mujoco.mj_kinematics(self.mj_model, data)
        quat = np.zeros(4)
        for geom, handle in handles.items():
            if self.mj_model.geom_bodyid[geom] == 0:
                continue  # world geoms never move
            mujoco.mju_mat2Quat(quat, data.geom_xmat[geom])
            handle.position = data.geom_xpos[geom].copy()
            handle.wxyz = quat.copy()

    def _add_geom(self, geom: int) -> None:
        mesh = geom_mesh(self.mj_model, geom)
        rgba = geom_rgba(self.mj_model, geom)
        if mesh is None or rgba[3] == 0:
            return
        self.handles[geom] = self.server.scene.add_mesh_simple(
            f"/world/geoms/{geom}",
            mesh.vertices,
            mesh.faces,
            color=np.round(rgba[:3] * 255).astype(np.uint8),
            opacity=float(rgba[3]) if rgba[3] < 1 else None,
            flat_shading=int(self.mj_model.geom_type[geom]) == mujoco.mjtGeom.mjGEOM_BOX,
            side="double" if int(self.mj_model.geom_type[geom]) == mujoco.mjtGeom.mjGEOM_PLANE else "front",
            visible=int(self.mj_model.geom_group[geom]) in self.shown_groups,
        )

    def group_counts(self) -> dict[int, int]:
        """Drawn geoms per geom group that has any."""
        groups = [int(self.mj_model.geom_group[geom]) for geom in self.handles]
        return {group: groups.count(group) for group in sorted(set(groups))}

    def show_group(self, group: int, shown: bool) -> None:
        self.shown_groups = (self.shown_groups | {group}) if shown else (self.shown_groups - {group})
        for geom, handle in (*self.handles.items(), *self.reference_handles.items()):
            if int(self.mj_model.geom_group[geom]) == group:
                handle.visible = shown

    def pose(self, qpos: np.ndarray, base_body: int, keep_base_at: np.ndarray | None = None) -> None:
        """Moves every geom to where `qpos` puts it; with `keep_base_at`, shifts the scene to draw the base there."""
        with self.server.atomic():
            self._pose_handles(self.handles, self.mj_data, qpos)
            self.base_pos = self.mj_data.xpos[base_body].copy()
            if keep_base_at is not None:  # else the shift stays: the robot walks off rather than jumping away
                self.world.position = keep_base_at - self.base_pos

    def place_world_geoms(self) -> None:
        """World geoms (floor, rails) are posed once, from the model's default configuration."""
        mujoco.mj_kinematics(self.mj_model, self.mj_data)
        quat = np.zeros(4)
        for geom, handle in self.handles.items():
            mujoco.mju_mat2Quat(quat, self.mj_data.geom_xmat[geom])
            handle.position, handle.wxyz = self.mj_data.geom_xpos[geom].copy(), quat.copy()


def group_toggler(scene: SceneView, group: int) -> Callable[[viser.GuiEvent], None]:
    """The callback of geom group `group`'s checkbox."""

    def toggle(event: viser.GuiEvent) -> None:
        scene.show_group(group, bool(event.target.value))

    return toggle


class ControlPanel:
    """The page's controls (read by the loop) and readouts (written by it)."""

    def __init__(self, server: viser.ViserServer, settings: ViewSettings, scene: SceneView, can_push: bool) -> None:
        gui = server.gui
        self.reset_requested = threading.Event()
        self.push_requested = threading.Event()
        with gui.add_folder("Simulation"):
            self.playing = gui.add_checkbox("Playing", initial_value=True)
            self.reset_button = gui.add_button("Reset")
            self.speed = gui.add_slider("Speed (x real time)", min=0.05, max=1.0, step=0.05, initial_value=1.0)
            self.deterministic = gui.add_checkbox("Deterministic actions", initial_value=True)
            self.follow = gui.add_checkbox("Camera follows base", initial_value=True)
            self.push_button = gui.add_button("Push base", visible=can_push)
        self.reset_button.on_click(lambda _: self.reset_requested.set())
        self.push_button.on_click(lambda _: self.push_requested.set())
        self.command_sliders = self._command_sliders(gui, settings.command_ranges)
        self._group_toggles(gui, scene)
        with gui.add_folder("Episode"):
            self.status = gui.add_markdown("starting")
        with gui.add_folder("Rewards"):
            self.reward_plot: viser.GuiUplotHandle | None = None
            self.reward_bars = gui.add_markdown("")
        with gui.add_folder("Actions", expand_by_default=False):
            self.action_bars = gui.add_markdown("")
        with gui.add_folder("Observations", expand_by_default=False):
            self.observation_bars = gui.add_markdown("")
        self.gui = gui

    @staticmethod
    def _command_sliders(
        gui: viser.GuiApi, ranges: tuple[tuple[str, float, float], ...]
    ) -> tuple[viser.GuiCheckboxHandle, list[viser.GuiSliderHandle]] | None:
        if not ranges:
            return None
        with gui.add_folder("Command"):
            hold = gui.add_checkbox("Set from sliders", initial_value=False)
            sliders = [
                gui.add_slider(label, min=low, max=high, step=(high - low) / 100 or 0.01, initial_value=0.0)
                for label, low, high in ranges
            ]

        def use_sliders(_: object) -> None:  # moving a slider means "use the sliders"
            hold.value = True  # type: ignore[misc]  # viser's setter lives on a base class mypy does not see

        for slider in sliders:
            slider.on_update(use_sliders)
        return hold, sliders

    @staticmethod
    def _group_toggles(gui: viser.GuiApi, scene: SceneView) -> None:
        with gui.add_folder("Geom groups", expand_by_default=False):
            for group, count in scene.group_counts().items():
                toggle = gui.add_checkbox(f"group {group} ({count} geoms)", initial_value=group in scene.shown_groups)
                toggle.on_update(group_toggler(scene, group))

    def held_command(self) -> np.ndarray | None:
        """The sliders' command while "Set from sliders" is on, else None (the task draws commands)."""
        if self.command_sliders is None or not self.command_sliders[0].value:
            return None
        return np.asarray([slider.value for slider in self.command_sliders[1]], dtype=np.float32)

    def show(self, report: StepReport, history: dict[str, deque[float]], settings: ViewSettings, ended: str) -> None:
        """Writes one step's numbers into the panel; `ended`: how the last episode ended (markdown)."""
        self.status.content = (
            f"**Return** {report.episode_return:.3f} &nbsp; **Steps** {report.episode_length}  \n"
            f"**Last episode ended by** {ended}"
        )
        names = list(report.reward_terms)
        self.reward_bars.content = bars_markdown(names, np.asarray(list(report.reward_terms.values())))
        self.action_bars.content = bars_markdown(list(settings.action_names), report.action)
        self.observation_bars.content = bars_markdown(observation_names(settings.observation_layout), report.obs)
        self._plot(history)

    def _plot(self, history: dict[str, deque[float]]) -> None:
        steps = len(next(iter(history.values()))) if history else 0
        if steps < 2:
            return
        data = (np.arange(steps, dtype=np.float64), *(np.asarray(values) for values in history.values()))
        if self.reward_plot is None:
            colors = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#808000")
            lines = [
                viser.uplot.Series(label=name, stroke=colors[i % len(colors)], width=1.5)
                for i, name in enumerate(history)
            ]
            series = (viser.uplot.Series(label="step"), *lines)
            scales = {"x": viser.uplot.Scale(time=False)}
            self.reward_plot = self.gui.add_uplot(
                data, series, title="reward terms by control step", scales=scales, aspect=1.6, order=-1
            )
        else:
            self.reward_plot.data = data


class Viewer:
    """Serves the page and runs the env: one control step per ctrl_dt / speed, on the calling thread."""

    def __init__(self, sim: ViewerSim, mj_model: mujoco.MjModel, base_body: int, settings: ViewSettings) -> None:
        self.sim, self.settings, self.base_body = sim, settings, base_body
        with contextlib.redirect_stdout(io.StringIO()):  # viser prints a URL banner whatever `verbose` says
            self.server = viser.ViserServer(host="0.0.0.0", port=settings.port, verbose=False)
        self.server.scene.set_up_direction("+z")
        self.scene = SceneView(self.server, mj_model, settings.geom_groups)
        self.scene.place_world_geoms()
        self.panel = ControlPanel(self.server, settings, self.scene, sim.push is not None)
        self.history: dict[str, deque[float]] = {}
        self.last_end = "(none yet)"
        self.steps = 0
        self.resets = 0  # episodes restarted from the page
        self.scene.pose(sim.qpos, base_body)
        if sim.reference_qpos is not None:
            self.scene.add_reference()
            self.scene.pose_reference(sim.reference_qpos)
        self.anchor = self.scene.base_pos  # where the base is drawn while following: the initial camera's aim
        self.server.initial_camera.look_at = self.anchor
        self.server.initial_camera.position = self.anchor + CAMERA_OFFSET

    @property
    def url(self) -> str:
        return f"http://localhost:{self.server.get_port()}"

    def _pose(self, qpos: np.ndarray) -> None:
        """Poses the scene from `qpos`, the base kept at the anchor while "Camera follows base" is checked."""
        self.scene.pose(qpos, self.base_body, self.anchor if self.panel.follow.value else None)

    def _record(self, report: StepReport) -> None:
        for name, value in report.reward_terms.items():
            self.history.setdefault(name, deque(maxlen=PLOT_STEPS)).append(value)
        if report.ended_by is not None:
            self.last_end = f"{report.ended_by} after {report.episode_length} steps, return {report.episode_return:.3f}"

    def _handle_requests(self) -> None:
        if self.panel.reset_requested.is_set():
            self.panel.reset_requested.clear()
            self.sim.reset()
            self.resets += 1
            self._pose(self.sim.qpos)
        if self.panel.push_requested.is_set():
            self.panel.push_requested.clear()
            self.sim.push_base()

    def step(self) -> StepReport:
        """One control step with the page's settings, shown in the scene."""
        self.sim.held_command = self.panel.held_command()
        report = self.sim.step(deterministic=self.panel.deterministic.value)
        self._pose(report.qpos if report.ended_by is None else self.sim.qpos)
        reference = report.reference_qpos if report.ended_by is None else self.sim.reference_qpos
        if reference is not None and self.scene.reference_handles:
            self.scene.pose_reference(reference)
        self._record(report)
        self.steps += 1
        return report

    def run(self, stop: threading.Event | None = None) -> None:
        """Steps until `stop` is set (or forever); the panel's readouts refresh every PANEL_UPDATE_S."""
        stop = stop or threading.Event()
        next_panel = 0.0
        while not stop.is_set():
            started = time.perf_counter()
            self._handle_requests()
            if not self.panel.playing.value:
                stop.wait(0.05)
                continue
            report = self.step()
            if started >= next_panel:
                self.panel.show(report, self.history, self.settings, f"{self.last_end}  \n**Resets** {self.resets}")
                next_panel = started + PANEL_UPDATE_S
            period = self.settings.ctrl_dt / max(self.panel.speed.value, 1e-3)
            stop.wait(max(0.0, period - (time.perf_counter() - started)))

    def close(self) -> None:
        self.server.stop()
