"""What ksim sees in an MJCF model, what MJX refuses in it, and what a control step of it costs.

    python -m ksim.inspect MODEL.xml                  # a bundled model's bare name works too: humanoid.xml
    python -m ksim.inspect MODEL.xml --envs 256 --ctrl-dt 0.02
    python -m ksim.inspect MODEL.xml --no-timing      # layout and refusals only, nothing compiled
    python -m ksim.inspect MODEL.xml --compare-tuned  # also time it with the advice's <option> changes

It prints the base body and root kind, the robot joints with their ranges, the actuators with their kind and
the ksim actuator class that fits them, the sites, the sensors, the geom pairs MJX checks for contact at every step, the
features MJX cannot run, and (unless --no-timing) the measured time of one batched control step with advice
where the model is expensive for MJX, and of the same step with physics_impl='mujoco' (C MuJoCo). Exit code 0;
1 when MJX cannot run the model; 2 for bad arguments or a file that is no loadable model.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.actuators import MOTOR, POSITION_SERVO, actuator_kind
from ksim.config import ConfigError
from ksim.engine import ModelLayout, PhysicsEngine, load_mujoco_model
from ksim.physics import create_engine, mjx_contract

# Settings above these cost MJX time at every physics step (MJX's documentation, "Performance tuning"):
# every env of a batch runs as many solver and line-search iterations as the slowest env needs.
CHEAP_SOLVER_ITERATIONS = 4
CHEAP_LS_ITERATIONS = 8
CHEAP_CONTACT_PAIRS = 16
CHEAP_SUBSTEPS = 8


def _name(mj_model: mujoco.MjModel, obj: mujoco.mjtObj, index: int) -> str:
    """The object's name, or for an unnamed one its kind and index: `free joint #0`, `geom #3`."""
    name = mujoco.mj_id2name(mj_model, obj, index)
    if name:
        return name
    if obj == mujoco.mjtObj.mjOBJ_JOINT:
        return f"{_enum(mj_model.jnt_type[index], mujoco.mjtJoint, 'mjJNT_')} joint #{index}"
    return f"{str(obj.name).removeprefix('mjOBJ_').lower()} #{index}"


def _enum(value: int, enum: type, prefix: str) -> str:
    return str(enum(int(value)).name).removeprefix(prefix).lower()


def _joint_range(mj_model: mujoco.MjModel, joint: int) -> str:
    kind = int(mj_model.jnt_type[joint])
    if kind in (int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)) or not mj_model.jnt_limited[joint]:
        return "unlimited"
    low, high = mj_model.jnt_range[joint]
    unit = "rad" if kind == int(mujoco.mjtJoint.mjJNT_HINGE) else "m"
    return f"[{low:.3g}, {high:.3g}] {unit}"


def layout_lines(mj_model: mujoco.MjModel, layout: ModelLayout) -> list[str]:
    """Base body, root kind and joints, each robot joint with its type and range."""
    root_names = ", ".join(_name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in layout.root_joints) or "none"
    lines = [
        f"base body: {layout.body_names[layout.base_body]!r}, root: {layout.root_kind} (root joints: {root_names})",
        f"robot joints ({len(layout.robot_joints)}; what JointPosition, JointVelocity and resets use by default):",
    ]
    for joint in layout.robot_joints:
        kind = _enum(mj_model.jnt_type[joint], mujoco.mjtJoint, "mjJNT_")
        lines.append(
            f"  {_name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, joint):<24} {kind:<6} {_joint_range(mj_model, joint)}"
        )
    return lines


def actuator_class(kinds: Sequence[str]) -> str:
    """The ksim actuator class that fits a model whose actuators are of these kinds."""
    if kinds and all(kind == MOTOR for kind in kinds):
        return "TorqueActuators (the action is the torque) or PositionActuators (ksim's PD loop)"
    if kinds and all(kind == POSITION_SERVO for kind in kinds):
        return "PositionServoActuators (targets around the default pose)"
    if not kinds:
        return "none: the model has no actuators"
    return "TorqueActuators (the action, scaled into each ctrlrange, is the control)"


def _actuator_detail(mj_model: mujoco.MjModel, actuator: int, kind: str) -> str:
    target = int(mj_model.actuator_trnid[actuator, 0])
    transmission = _enum(mj_model.actuator_trntype[actuator], mujoco.mjtTrn, "mjTRN_")
    if transmission in ("joint", "jointinparent"):
        drives = f"joint {_name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, target)}"
    elif transmission == "tendon":
        drives = f"tendon {_name(mj_model, mujoco.mjtObj.mjOBJ_TENDON, target)}"
    else:
        drives = f"{transmission} {target}"
    detail = f"gear {mj_model.actuator_gear[actuator, 0]:.3g}"
    if kind == POSITION_SERVO:
        detail += f", kp {mj_model.actuator_gainprm[actuator, 0]:.3g}, kv {-mj_model.actuator_biasprm[actuator, 2]:.3g}"
    if mj_model.actuator_ctrllimited[actuator]:
        low, high = mj_model.actuator_ctrlrange[actuator]
        detail += f", ctrl [{low:.3g}, {high:.3g}]"
    return f"{drives}, {detail}"


def actuator_lines(mj_model: mujoco.MjModel) -> list[str]:
    kinds = [actuator_kind(mj_model, i) for i in range(mj_model.nu)]
    lines = [f"actuators ({mj_model.nu}):"]
    for actuator, kind in enumerate(kinds):
        name = _name(mj_model, mujoco.mjtObj.mjOBJ_ACTUATOR, actuator)
        lines.append(f"  {name:<24} {kind:<14} {_actuator_detail(mj_model, actuator, kind)}")
    lines.append(f"  fits: {actuator_class(kinds)}")
    return lines


def site_lines(mj_model: mujoco.MjModel) -> list[str]:
    """Each site with its body: components that name feet or points take site names (looked up first)."""
    lines = [f"sites ({mj_model.nsite}; feet and points may be named by site, geom or body):"]
    for site in range(mj_model.nsite):
        body = _name(mj_model, mujoco.mjtObj.mjOBJ_BODY, int(mj_model.site_bodyid[site]))
        lines.append(f"  {_name(mj_model, mujoco.mjtObj.mjOBJ_SITE, site):<24} on body {body}")
    return lines


def sensor_lines(mj_model: mujoco.MjModel) -> list[str]:
    lines = [f"sensors ({mj_model.nsensor}):"]
    for sensor in range(mj_model.nsensor):
        kind = _enum(mj_model.sensor_type[sensor], mujoco.mjtSensor, "mjSENS_")
        name = _name(mj_model, mujoco.mjtObj.mjOBJ_SENSOR, sensor)
        lines.append(f"  {name:<24} {kind} ({mj_model.sensor_dim[sensor]} values)")
    return lines


def contact_lines(mj_model: mujoco.MjModel, pairs: Sequence[tuple[int, int, int]], most: int = 12) -> list[str]:
    """The geom pairs MJX collides at every step (contact on or off by `<flag contact>`)."""
    if mj_model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT:
        return ["contacts: off (<flag contact='disable'/>)"]
    lines = [f"contact pairs MJX checks every physics step ({len(pairs)}):"]
    for g1, g2, _ in pairs[:most]:
        first, second = (
            f"{_name(mj_model, mujoco.mjtObj.mjOBJ_GEOM, g)} "
            f"({_enum(mj_model.geom_type[g], mujoco.mjtGeom, 'mjGEOM_')}, "
            f"body {_name(mj_model, mujoco.mjtObj.mjOBJ_BODY, int(mj_model.geom_bodyid[g]))})"
            for g in (g1, g2)
        )
        lines.append(f"  {first} ~ {second}")
    if len(pairs) > most:
        lines.append(f"  ... and {len(pairs) - most} more")
    return lines


def cost_advice(mj_model: mujoco.MjModel, num_substeps: int, num_pairs: int) -> list[str]:
    """What makes the model expensive for MJX, and the MJCF change that makes it cheaper."""
    option = mj_model.opt
    advice = []
    if option.iterations > CHEAP_SOLVER_ITERATIONS:
        advice.append(
            f'solver iterations={option.iterations}: MJX runs them for the whole batch; try <option iterations="'
            f'{CHEAP_SOLVER_ITERATIONS}"/> (Newton converges in a few)'
        )
    if option.ls_iterations > CHEAP_LS_ITERATIONS:
        advice.append(
            f'line-search iterations={option.ls_iterations}: try <option ls_iterations="{CHEAP_LS_ITERATIONS}"/>'
        )
    if option.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        advice.append('integrator RK4 evaluates the dynamics 4 times a step: try <option integrator="implicitfast"/>')
    if option.solver == mujoco.mjtSolver.mjSOL_CG:
        advice.append('solver CG needs more iterations than Newton on small models: try <option solver="Newton"/>')
    if option.cone == mujoco.mjtCone.mjCONE_ELLIPTIC:
        advice.append('elliptic friction cones cost more in the solver: try <option cone="pyramidal"/>')
    if num_substeps > CHEAP_SUBSTEPS:
        advice.append(
            f"{num_substeps} physics steps per control step (timestep {option.timestep:g} s): a larger timestep, "
            "if the model stays stable, cuts the cost in proportion"
        )
    if num_pairs > CHEAP_CONTACT_PAIRS:
        advice.append(
            f"{num_pairs} geom pairs are collided every step: let only what touches collide (e.g. feet and floor, "
            "with contype/conaffinity or <exclude>)"
        )
    meshes = int(np.sum(mj_model.geom_type == mujoco.mjtGeom.mjGEOM_MESH))
    if meshes and num_pairs:
        advice.append(f"{meshes} mesh geoms: convex mesh collisions cost far more than capsules, boxes and spheres")
    return advice


def tuned_options(mj_model: mujoco.MjModel) -> tuple[mujoco.MjModel, list[str]]:
    """A copy of the model with the advice's <option> changes applied, and what they were."""
    tuned, changes = copy.deepcopy(mj_model), []
    option = tuned.opt
    if option.iterations > CHEAP_SOLVER_ITERATIONS:
        option.iterations = CHEAP_SOLVER_ITERATIONS
        changes.append(f"iterations={CHEAP_SOLVER_ITERATIONS}")
    if option.ls_iterations > CHEAP_LS_ITERATIONS:
        option.ls_iterations = CHEAP_LS_ITERATIONS
        changes.append(f"ls_iterations={CHEAP_LS_ITERATIONS}")
    if option.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        fluid = option.density > 0 or option.viscosity > 0 or bool(np.any(option.wind))
        option.integrator = mujoco.mjtIntegrator.mjINT_EULER if fluid else mujoco.mjtIntegrator.mjINT_IMPLICITFAST
        changes.append("integrator=" + ("Euler" if fluid else "implicitfast"))
    if option.solver == mujoco.mjtSolver.mjSOL_CG:
        option.solver = mujoco.mjtSolver.mjSOL_NEWTON
        changes.append("solver=Newton")
    if option.cone == mujoco.mjtCone.mjCONE_ELLIPTIC:
        option.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
        changes.append("cone=pyramidal")
    return tuned, changes


@dataclass(frozen=True)
class StepCost:
    compile_s: float
    control_step_s: float  # one control step of the whole batch
    num_envs: int
    num_substeps: int

    @property
    def env_steps_per_s(self) -> float:
        return self.num_envs / self.control_step_s


def measure_step(engine: PhysicsEngine, num_envs: int, repeats: int = 5) -> StepCost:
    """Compiles one batched control step (zero control, from the default pose) and times it."""
    qpos = jnp.tile(jnp.asarray(engine.default_qpos, jnp.float32), (num_envs, 1))
    qvel = jnp.zeros((num_envs, engine.mj_model.nv))
    data = jax.jit(jax.vmap(engine.make_data))(qpos, qvel)
    zero_ctrl = jnp.zeros(engine.action_dim)
    step = jax.jit(jax.vmap(lambda data: engine.step(data, lambda _: zero_ctrl)[0]))
    start = time.perf_counter()
    compiled = step.lower(data).compile()
    compile_s = time.perf_counter() - start
    data = jax.block_until_ready(compiled(data))  # the first run warms caches up
    start = time.perf_counter()
    for _ in range(repeats):
        data = compiled(data)
    jax.block_until_ready(data)
    return StepCost(compile_s, (time.perf_counter() - start) / repeats, num_envs, engine.num_substeps)


def cost_lines(cost: StepCost) -> list[str]:
    per_physics_step = cost.num_envs * cost.num_substeps / cost.control_step_s
    return [
        f"cost: one control step of {cost.num_envs} envs ({cost.num_substeps} physics steps each) takes "
        f"{1e3 * cost.control_step_s:.1f} ms: {cost.env_steps_per_s:,.0f} env-steps/s, "
        f"{per_physics_step:,.0f} physics steps/s (compile {cost.compile_s:.1f} s)"
    ]


def native_cost_line(native: StepCost, mjx_cost: StepCost | None) -> str:
    """The same control step with physics_impl='mujoco' (C MuJoCo), against MJX's where MJX runs the model."""
    versus = f", {native.env_steps_per_s / mjx_cost.env_steps_per_s:.1f}x MJX's" if mjx_cost else ""
    return (
        f"cost with physics_impl='mujoco': {1e3 * native.control_step_s:.1f} ms: "
        f"{native.env_steps_per_s:,.0f} env-steps/s{versus} (compile {native.compile_s:.1f} s)"
    )


def inspect_model(
    mj_model: mujoco.MjModel,
    base_body: str | None = None,
    root_joints: Sequence[str] | None = None,
    ctrl_dt: float = 0.02,
    num_envs: int = 64,
    timing: bool = True,
    compare_tuned: bool = False,
) -> tuple[list[str], bool]:
    """The report's lines, and whether MJX can run the model."""
    layout = ModelLayout.create(mj_model, base_body, root_joints)
    option = mj_model.opt
    num_substeps = max(1, round(ctrl_dt / option.timestep))
    pairs = mjx_contract.collision_pairs(mj_model)
    lines = [
        f"model: {mj_model.nbody - 1} bodies, {mj_model.njnt} joints (nq {mj_model.nq}, nv {mj_model.nv}), "
        f"{mj_model.nu} actuators, {mj_model.ngeom} geoms",
        f"physics: timestep {option.timestep:g} s ({num_substeps} per control step of {ctrl_dt:g} s), integrator "
        f"{_enum(option.integrator, mujoco.mjtIntegrator, 'mjINT_')}, solver "
        f"{_enum(option.solver, mujoco.mjtSolver, 'mjSOL_')} (iterations {option.iterations}, line search "
        f"{option.ls_iterations}), cone {_enum(option.cone, mujoco.mjtCone, 'mjCONE_')}",
        *layout_lines(mj_model, layout),
        *actuator_lines(mj_model),
        *site_lines(mj_model),
        *sensor_lines(mj_model),
        *contact_lines(mj_model, pairs),
    ]
    num_pairs = 0 if option.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT else len(pairs)
    refusals = mjx_contract.refusals(mj_model)
    if refusals:
        lines += ["MJX cannot run this model:", *(f"  {refusal}" for refusal in refusals)]
    else:
        lines.append(f"MJX: runs this model (mujoco-mjx {mjx_contract.mjx_version()})")
    ctrl_dt = num_substeps * option.timestep
    native = None
    if timing:
        native_engine = create_engine(mj_model, ctrl_dt, option.timestep, base_body, root_joints, "mujoco")
        native = measure_step(native_engine, num_envs)
    if timing and not refusals:
        cost = measure_step(create_engine(mj_model, ctrl_dt, option.timestep, base_body, root_joints, "jax"), num_envs)
        lines += cost_lines(cost)
        tuned, changes = tuned_options(mj_model)
        if compare_tuned and changes:
            tuned_engine = create_engine(tuned, ctrl_dt, option.timestep, base_body, root_joints, "jax")
            tuned_cost = measure_step(tuned_engine, num_envs)
            lines.append(
                f"with {', '.join(changes)}: {tuned_cost.env_steps_per_s:,.0f} env-steps/s, "
                f"{tuned_cost.env_steps_per_s / cost.env_steps_per_s:.1f}x (check that the model still behaves)"
            )
    if native is not None:
        lines.append(native_cost_line(native, None if refusals else cost))
    advice = cost_advice(mj_model, num_substeps, num_pairs)
    lines += ["advice:", *(f"  {item}" for item in advice)] if advice else ["advice: none, the model is cheap for MJX"]
    return lines, not refusals


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ksim.inspect", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="MJCF file (or the name of a model bundled with ksim)")
    parser.add_argument("--base-body", default=None, help="the base body (default: the first body under the world)")
    parser.add_argument("--root-joints", nargs="*", default=None, help="root joints by name (default: the joint rule)")
    parser.add_argument("--ctrl-dt", type=float, default=0.02, help="control period in seconds (default 0.02)")
    parser.add_argument("--envs", type=int, default=64, help="envs in the timed batch (default 64)")
    parser.add_argument("--no-timing", action="store_true", help="do not compile and time a control step")
    parser.add_argument(
        "--compare-tuned", action="store_true", help="also time the model with the advice's <option> changes applied"
    )
    args = parser.parse_args(argv)
    if args.envs <= 0:
        parser.error(f"--envs={args.envs} must be positive")
    if args.ctrl_dt <= 0:
        parser.error(f"--ctrl-dt={args.ctrl_dt} must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mj_model = load_mujoco_model(args.model)
    except (FileNotFoundError, ValueError) as error:  # MuJoCo's XML errors are ValueErrors
        print(f"error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        lines, runs = inspect_model(
            mj_model,
            args.base_body,
            args.root_joints,
            args.ctrl_dt,
            args.envs,
            timing=not args.no_timing,
            compare_tuned=args.compare_tuned,
        )
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
