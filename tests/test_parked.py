"""``parked_vehicles`` on a hand-built ObjectLog with hand-computed answers."""

import jax
import numpy as np

from jaxdrive.scenarios.parked import parked_vehicles
from jaxdrive.types import ObjectLog, ObjectType

V, P = int(ObjectType.VEHICLE), int(ObjectType.PEDESTRIAN)


def _log() -> tuple[ObjectLog, np.ndarray]:
    """7 slots x 4 steps, and the expected (7,) answer with the default thresholds
    (extent < 0.5 m, speed < 1 m/s)."""
    a, t = 7, 4
    xy = np.zeros((a, t, 2), np.float32)
    vel = np.zeros((a, t, 2), np.float32)
    valid = np.ones((a, t), bool)
    kind = np.full((a,), V, np.int32)
    # 0: jitter; farthest pair (0, 0)-(0.3, 0.2): 0.36 m; speeds 0.2 m/s -> parked.
    xy[0] = [(0, 0), (0.3, 0), (0.3, 0.2), (0.1, 0.1)]
    vel[0] = (0.2, 0.0)
    # 1: drives 1 m per step (10 m/s) -> moving.
    xy[1] = [(0, 0), (1, 0), (2, 0), (3, 0)]
    vel[1] = (10.0, 0.0)
    # 2: seen for two steps only, 0.127 m apart but at 1.27 m/s -> moving.
    valid[2, :2] = False
    xy[2, 2:] = [(5, 5), (5.127, 5)]
    vel[2, 2:] = (1.27, 0.0)
    # 3: a pedestrian standing still -> not a vehicle.
    kind[3] = P
    xy[3] = (9, 9)
    # 4: never valid -> False.
    valid[4] = False
    # 5: valid at steps 0 and 3 at (7, 7); the invalid steps hold padding (0, 0) and a
    # wild speed, which must not count -> parked.
    valid[5, 1:3] = False
    xy[5] = [(7, 7), (0, 0), (0, 0), (7, 7)]
    vel[5, 1:3] = (50.0, 0.0)
    # 6: centres exactly 0.5 m apart: not below the threshold -> moving.
    xy[6] = [(0, 0), (0.5, 0), (0.5, 0), (0.5, 0)]
    want = np.array([True, False, False, False, False, True, False])
    log = ObjectLog(
        xy=xy, yaw=np.zeros((a, t), np.float32), vel=vel, valid=valid,
        length=np.full((a,), 4.5, np.float32), width=np.full((a,), 2.0, np.float32),
        type=kind, goal=xy[:, -1], is_sdc=np.eye(1, a, dtype=bool)[0],
        of_interest=np.zeros((a,), bool), to_predict=np.zeros((a,), bool))
    return log, want


def test_parked_vehicles_hand_built_log():
    log, want = _log()
    np.testing.assert_array_equal(np.asarray(parked_vehicles(log)), want)


def test_parked_vehicles_thresholds_and_batch():
    log, want = _log()
    # Looser extent: slot 6 (0.5 m) becomes parked; slot 2 stays moving by its speed.
    loose = np.asarray(parked_vehicles(log, max_extent=0.6))
    np.testing.assert_array_equal(loose, want | (np.arange(7) == 6))
    # Looser speed as well: slot 2 (1.27 m/s, 0.127 m) becomes parked.
    looser = np.asarray(parked_vehicles(log, max_extent=0.6, max_speed=1.5))
    np.testing.assert_array_equal(looser, loose | (np.arange(7) == 2))
    # Leading batch dims, under jit.
    batch = jax.tree.map(lambda x: np.stack([x, x]), log)
    got = np.asarray(jax.jit(parked_vehicles)(batch))
    np.testing.assert_array_equal(got, np.stack([want, want]))
