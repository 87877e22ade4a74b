"""Logs: CSV/NPZ round trips, one test per validation error, and preprocessing against signals
with known answers (resampling, zero-phase filtering, derivatives, trimming, decimation); then
the real Panda log, loaded and preprocessed as its README describes, and identified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import jaxarm
from jaxarm import identification as ident
from jaxarm.identify import linear_model
from jaxarm.logs import Log, LogError, default_trim, load_log, preprocess_log, save_log

PANDA = Path(__file__).resolve().parents[2] / "shared/data/panda"


def _log(N=50, n=2, seed=0, channels=("dq", "ddq", "tau", "V", "I")):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.uniform(0.5e-3, 1.5e-3, N))
    fields = {c: rng.normal(size=(N, n)) for c in ("q", *channels)}
    return Log(t=t, source="made", **fields)


def _write_csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "\n".join(",".join(str(x) for x in row) for row in rows) + "\n")
    return path


def _two_joint_rows(N=6):
    t = 0.01 * np.arange(N)
    return [[t[k], 0.1 * k, -0.2 * k, 1.0 + k, 2.0 - k] for k in range(N)]


HEADER = ["t", "q1", "q2", "tau1", "tau2"]


# --------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("suffix", [".csv", ".npz"])
def test_round_trip(tmp_path, suffix):
    log = _log()
    back = load_log(save_log(log, tmp_path / f"log{suffix}"))
    assert back.channels == ("q", "dq", "ddq", "tau", "V", "I") and back.n == 2 and len(back) == 50
    for c in ("t", *back.channels):
        np.testing.assert_array_equal(getattr(back, c), getattr(log, c))  # repr() of floats is exact


def test_npz_one_key_per_column_and_column_order(tmp_path):
    log = _log(channels=("tau",))
    np.savez(tmp_path / "cols.npz", tau2=log.tau[:, 1], q1=log.q[:, 0], t=log.t, q2=log.q[:, 1], tau1=log.tau[:, 0])
    back = load_log(tmp_path / "cols.npz", jaxarm.make_arm("RR"))
    np.testing.assert_array_equal(back.tau, log.tau)
    np.testing.assert_array_equal(back.q, log.q)
    assert back.dq is None and back.channels == ("q", "tau")
    # CSV columns in any order, too.
    rows = _two_joint_rows()
    path = _write_csv(tmp_path / "shuffled.csv", ["tau2", "q1", "t", "tau1", "q2"], [[r[4], r[1], r[0], r[3], r[2]] for r in rows])
    back = load_log(path)
    np.testing.assert_array_equal(back.tau, np.array(rows)[:, 3:5])


def test_slice_split_and_properties():
    log = _log(N=200, channels=("tau",))
    t_mid = log.t[120]
    first, second = log.split(t_mid)
    assert len(first) == 120 and len(second) == 80 and second.t[0] == t_mid
    np.testing.assert_array_equal(np.concatenate([first.tau, second.tau]), log.tau)
    part = log.slice(log.t[10], log.t[20])
    assert len(part) == 10 and part.t[0] == log.t[10]
    assert log.duration == pytest.approx(log.t[-1] - log.t[0])
    assert log.sample_rate == pytest.approx(1 / np.median(np.diff(log.t)))
    with pytest.raises(LogError, match="q: expected shape"):
        Log(t=log.t, q=log.q[:-1])
    with pytest.raises(LogError, match=r"tau: expected shape \(200, 2\) like q"):
        Log(t=log.t, q=log.q, tau=log.tau[:, :1])


# --------------------------------------------------------------------------------------------
# Validation


def test_missing_columns(tmp_path):
    rows = _two_joint_rows()
    path = _write_csv(tmp_path / "a.csv", ["t", "q1", "q2", "tau1"], [r[:4] for r in rows])
    with pytest.raises(LogError, match=r"a.csv: missing column tau2: channel tau needs tau1..tau2"):
        load_log(path)
    path = _write_csv(tmp_path / "b.csv", ["q1", "q2"], [r[1:3] for r in rows])
    with pytest.raises(LogError, match=r"b.csv: missing column 't'"):
        load_log(path)
    path = _write_csv(tmp_path / "c.csv", ["t", "q1", "q3"], [r[:3] for r in rows])
    with pytest.raises(LogError, match="c.csv: missing column q2"):
        load_log(path)
    path = _write_csv(tmp_path / "d.csv", ["t", "q1", "q2", "torque1"], [r[:4] for r in rows])
    with pytest.raises(LogError, match=r"column 'torque1': unknown; expected t, q1..qn"):
        load_log(path)
    path = _write_csv(tmp_path / "e.csv", ["t", "q1", "q2", "tau1", "tau2", "tau3"], [r + [0.0] for r in rows])
    with pytest.raises(LogError, match="column tau3: joint 3 beyond the 2 joints"):
        load_log(path)


def test_duplicated_columns(tmp_path):
    rows = _two_joint_rows()
    path = _write_csv(tmp_path / "dup.csv", ["t", "q1", "q2", "q1", "tau2"], rows)
    with pytest.raises(LogError, match=r"dup.csv: line 1: duplicated column 'q1' \(columns 2 and 4\)"):
        load_log(path)
    np.savez(tmp_path / "dup.npz", t=np.arange(3.0), q=np.zeros((3, 2)), q2=np.zeros(3))
    with pytest.raises(LogError, match="duplicated column 'q2'"):
        load_log(tmp_path / "dup.npz")


def test_joint_count_must_match_the_arm(tmp_path):
    path = _write_csv(tmp_path / "two.csv", HEADER, _two_joint_rows())
    with pytest.raises(LogError, match=r"two.csv: joint count: the log has 2 joints \(q1..q2\), the arm 'arm' has 3"):
        load_log(path, jaxarm.make_arm("RRR"))
    assert load_log(path, jaxarm.make_arm("RR")).n == 2


def test_time_must_increase(tmp_path):
    rows = _two_joint_rows(8)
    rows[4][0] = rows[3][0]  # line 6 repeats line 5's time
    rows[6][0] = rows[5][0] - 0.5
    path = _write_csv(tmp_path / "time.csv", HEADER, rows)
    with pytest.raises(LogError, match=r"time.csv: column t: expected strictly increasing time, but it does not increase at line 6, 8 "):
        load_log(path)


def test_nonfinite_rows_are_listed_and_can_be_dropped(tmp_path):
    rows = _two_joint_rows(8)
    rows[1][2] = "nan"
    rows[5][3] = "inf"
    rows[6][0] = ""  # an empty field reads as NaN
    path = _write_csv(tmp_path / "nan.csv", HEADER, rows)
    with pytest.raises(LogError, match=r"nan.csv: 3 line\(s\) with NaN/inf values: line 3, 7, 8; pass drop_nonfinite=True"):
        load_log(path)
    log = load_log(path, drop_nonfinite=True)
    assert len(log) == 5 and log.info["dropped_nonfinite"] == [3, 7, 8]
    np.testing.assert_array_equal(log.t, np.array(rows, dtype=object)[[0, 2, 3, 4, 7], 0].astype(float))
    # NPZ reports samples (0-based).
    np.savez(tmp_path / "nan.npz", t=np.arange(4.0), q=np.array([[0.0], [np.nan], [1.0], [2.0]]))
    with pytest.raises(LogError, match=r"1 sample\(s\) with NaN/inf values: sample 1;"):
        load_log(tmp_path / "nan.npz")


def test_malformed_files(tmp_path):
    with pytest.raises(LogError, match="no such file"):
        load_log(tmp_path / "absent.csv")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(LogError, match="unknown log format '.json'"):
        load_log(tmp_path / "x.json")
    path = _write_csv(tmp_path / "nohead.csv", ["0.0", "1.0"], [[0.1, 1.0]])
    with pytest.raises(LogError, match="line 1: expected a header row"):
        load_log(path)
    path = tmp_path / "ragged.csv"
    path.write_text("t,q1\n0,1\n0.1,2,3\n")
    with pytest.raises(LogError, match="every row needs 2 comma-separated values"):
        load_log(path)
    np.savez(tmp_path / "len.npz", t=np.arange(3.0), q1=np.zeros(4))
    with pytest.raises(LogError, match="column 'q1': has 4 samples, expected 3 like t"):
        load_log(tmp_path / "len.npz")
    np.savez(tmp_path / "shape.npz", t=np.arange(3.0), tau=np.zeros(3), q=np.zeros((3, 1)))
    with pytest.raises(LogError, match=r"array 'tau': expected shape \(N, n\)"):
        load_log(tmp_path / "shape.npz")


# --------------------------------------------------------------------------------------------
# Preprocessing


def _signal_log(t, w, channels=("dq", "tau")):
    """q = sin(w t + 0.3) on joint 1 and a slower cosine on joint 2, with exact dq, tau = q."""
    q = np.stack([np.sin(w * t + 0.3), 0.5 * np.cos(0.5 * w * t)], axis=1)
    dq = np.stack([w * np.cos(w * t + 0.3), -0.25 * w * np.sin(0.5 * w * t)], axis=1)
    fields = {"dq": dq, "tau": q.copy()}
    return Log(t=t, q=q, source="signal", **{c: fields[c] for c in channels})


def test_resampling_of_nonuniform_time():
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.uniform(0.5e-3, 1.5e-3, 3000))  # non-uniform, mean 1 ms
    w = 2 * np.pi * 0.8
    out = preprocess_log(_signal_log(t, w), rate=500.0, trim=0.0)
    assert out.info["resampled"] and out.info["rate"] == 500.0
    np.testing.assert_allclose(np.diff(out.t), 2e-3, rtol=1e-9)
    assert out.t[0] == t[0] and out.t[-1] <= t[-1]
    # Linear interpolation error <= h^2 / 8 max|q''| with h = the largest original gap.
    bound = np.max(np.diff(t)) ** 2 / 8 * w**2
    exact = np.sin(w * out.t + 0.3)
    assert np.max(np.abs(out.q[:, 0] - exact)) <= bound
    assert np.max(np.abs(out.tau[:, 0] - exact)) <= bound


def test_zero_phase_filter():
    """A 1 Hz sine plus 40 Hz noise through a 5 Hz filter: the sine comes out with no lag (error
    < 1e-5 a second away from the ends, < 1e-3 after the default trim; a causal filter of this
    order would lag by ~0.5 rad), and the 40 Hz part is gone."""
    t = np.arange(0, 6, 1e-3)
    clean = np.sin(2 * np.pi * t + 0.3)
    log = Log(t=t, q=(clean + 0.3 * np.sin(2 * np.pi * 40 * t))[:, None], tau=(clean + 0.3 * np.sin(2 * np.pi * 40 * t))[:, None])
    out = preprocess_log(log, cutoff=5.0)
    expected = np.sin(2 * np.pi * out.t + 0.3)
    inner = (out.t > 1.0) & (out.t < 5.0)
    for channel in (out.q, out.tau):
        assert np.max(np.abs(channel[:, 0] - expected)) < 1e-3
        assert np.max(np.abs(channel[inner, 0] - expected[inner])) < 1e-5
    # Same with the torque left alone: the noise stays.
    raw = preprocess_log(log, cutoff=5.0, filter_torque=False)
    assert np.max(np.abs(raw.tau[:, 0] - expected)) > 0.25
    # The filter is a fourth-order Butterworth: half power (gain^2 = 1/2 twice -> 1/2) at the cutoff.
    at_cutoff = preprocess_log(Log(t=t, q=np.sin(2 * np.pi * 5.0 * t)[:, None]), cutoff=5.0)
    mid = slice(1000, -1000)
    assert np.max(np.abs(at_cutoff.q[mid, 0])) == pytest.approx(0.5, abs=0.01)


def test_derivatives_on_a_known_signal():
    t = np.arange(0, 5, 1e-3)
    w = 2 * np.pi * 1.0
    log = _signal_log(t, w, channels=("tau",))
    out = preprocess_log(log, cutoff=20.0, velocity="differentiate")
    assert out.info["velocity"] == "differentiate"
    dq = w * np.cos(w * out.t + 0.3)
    ddq = -(w**2) * np.sin(w * out.t + 0.3)
    # Central differences: relative error (w dt)^2 / 6 = 7e-6 per differentiation, away from the
    # ends; within the default trim of them the filter's edge error stays below 1e-3.
    inner = (out.t > 1.0) & (out.t < 4.0)
    assert np.max(np.abs(out.dq[inner, 0] - dq[inner])) < 2e-5 * w
    assert np.max(np.abs(out.ddq[inner, 0] - ddq[inner])) < 2e-5 * w**2
    assert np.max(np.abs(out.dq[:, 0] - dq)) < 1e-3 * w
    assert np.max(np.abs(out.ddq[:, 0] - ddq)) < 1e-3 * w**2
    logged = preprocess_log(_signal_log(t, w), cutoff=20.0)  # "auto": the logged dq
    assert logged.info["velocity"] == "logged"
    assert np.max(np.abs(logged.ddq[inner, 0] - ddq[inner])) < 2e-5 * w**2
    with pytest.raises(LogError, match="velocity='logged' but the log has no dq"):
        preprocess_log(log, velocity="logged")


def test_trimming_and_decimation():
    t = np.arange(0, 4, 1e-3)
    log = _signal_log(t, 2 * np.pi * 0.7)
    out = preprocess_log(log, cutoff=10.0)
    assert out.info["trim"] == default_trim(10.0, 4) == 0.4
    assert out.t[0] == pytest.approx(0.4) and out.t[-1] == pytest.approx(t[-1] - 0.4)
    # Edge effects are gone by the default trim: errors below 1e-3 of the amplitudes where kept.
    w = 2 * np.pi * 0.7
    assert np.max(np.abs(out.q[:, 0] - np.sin(w * out.t + 0.3))) < 1e-3
    assert np.max(np.abs(out.ddq[:, 0] + w**2 * np.sin(w * out.t + 0.3))) < 1e-3 * w**2
    untrimmed = preprocess_log(log, cutoff=10.0, trim=0.0)
    assert len(untrimmed) == len(log)
    dec = preprocess_log(log, cutoff=10.0, trim=0.5, decimate=4)
    np.testing.assert_allclose(np.diff(dec.t), 4e-3, rtol=1e-9)
    np.testing.assert_array_equal(dec.q, preprocess_log(log, cutoff=10.0, trim=0.5).q[::4])
    assert dec.info["rate"] == pytest.approx(250.0) and dec.info["decimate"] == 4 and dec.t[0] == pytest.approx(0.5)
    with pytest.warns(UserWarning, match="aliases content above 125 Hz"):
        preprocess_log(log, decimate=4)
    with pytest.raises(ValueError, match="cutoff: expected 0 < cutoff < rate / 2 = 500 Hz"):
        preprocess_log(log, cutoff=600.0)
    with pytest.raises(ValueError, match="decimate: expected an integer >= 1"):
        preprocess_log(log, decimate=0)
    with pytest.raises(LogError, match="leaves 0 sample"):
        preprocess_log(log, trim=2.5)


# --------------------------------------------------------------------------------------------
# The real Panda log


def test_panda_log_load_preprocess_and_identify():
    path = PANDA / "panda_excitation_traj1.csv"
    if not path.is_file():
        pytest.skip(f"Panda log not found at {path}")
    arm = jaxarm.load_arm("panda")
    raw = load_log(path, arm)
    assert (len(raw), raw.n, raw.channels) == (20544, 7, ("q", "dq", "tau"))
    gaps = np.diff(raw.t)
    assert 0.6e-3 < gaps.min() < 0.8e-3 and 8e-3 < gaps.max() < 9e-3 and raw.duration == pytest.approx(21.0, abs=0.01)
    log = preprocess_log(raw, rate=1000, cutoff=10, velocity="logged")  # the README's reference
    assert log.info["resampled"] and np.allclose(np.diff(log.t), 1e-3)
    fit_part, held_out = log.split(14.7)
    # The README's "RMS of measured torque" row is that of the whole (resampled) log, not only
    # of the held-out part beside whose RMSE it stands (there joint 3's is 7.2, not 10.7).
    whole = preprocess_log(raw, rate=1000, velocity="logged", trim=0.0)
    rms = np.sqrt(np.mean(whole.tau**2, axis=0))
    np.testing.assert_allclose(rms, [2.40, 19.8, 10.7, 15.2, 0.99, 1.07, 0.28], rtol=0.02)  # 2-3 digits given
    result = ident.identify_linear(arm, fit_part)
    assert result.rank == result.base.rank == 69 and np.all(np.isfinite(result.beta_std))
    Y, known = linear_model._linear_model(arm, held_out.q, held_out.dq, held_out.ddq, True, "test")
    predicted = np.einsum("knp,p->kn", np.asarray(Y), result.parameters) + np.asarray(known)
    rmse = ident.torque_rmse(held_out.tau, predicted)
    print(json.dumps({"panda_linear_ols": {"fit_rmse": np.round(result.rmse, 4).tolist(), "held_out_rmse": np.round(rmse, 4).tolist(),
                                           "rank": result.rank, "condition_number": round(result.condition_number, 2)}}))
    assert np.all(rmse < 0.5 * rms)  # a real fit, far better than predicting zero


def test_gaps_split_the_log_and_nothing_is_interpolated_across_them():
    """Two runs concatenated with a 2 s hole: each is filtered and differentiated alone, so the
    result equals preprocessing the runs separately, and no sample falls inside the hole."""
    rate = 200.0
    t1 = np.arange(0.0, 4.0, 1 / rate)
    t2 = np.arange(6.0, 10.0, 1 / rate)
    def run(t, phase):
        q = np.stack([np.sin(1.3 * t + phase), np.cos(0.7 * t - phase)], axis=1)
        dq = np.stack([1.3 * np.cos(1.3 * t + phase), -0.7 * np.sin(0.7 * t - phase)], axis=1)
        return Log(t=t, q=q, dq=dq, tau=2.0 * q)
    a, b = run(t1, 0.0), run(t2, 2.0)  # the second run starts somewhere else: a jump a resampler would bridge
    joined = Log(t=np.concatenate([t1, t2]), q=np.concatenate([a.q, b.q]), dq=np.concatenate([a.dq, b.dq]),
                 tau=np.concatenate([a.tau, b.tau]), source="joined")
    assert joined.gaps().tolist() == [len(t1) - 1] and [len(s) for s in joined.segments()] == [len(t1), len(t2)]
    out = preprocess_log(joined, cutoff=5.0)
    parts = [preprocess_log(x, cutoff=5.0) for x in (a, b)]
    assert out.info["segments"] == 2 and out.info["segment_starts"] == [0, len(parts[0])]
    assert not np.any((out.t > 4.0) & (out.t < 6.0))
    for c in ("q", "dq", "ddq", "tau"):
        np.testing.assert_array_equal(getattr(out, c), np.concatenate([getattr(p, c) for p in parts]))
    # bridging the gap (what a single resampling would do) would have changed the accelerations
    bridged = preprocess_log(joined, cutoff=5.0, max_gap=np.inf)
    assert bridged.info["segments"] == 1 and np.any((bridged.t > 4.0) & (bridged.t < 6.0))


def test_jitter_is_not_a_gap():
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(0.7e-3, 8.8e-3 / 8, 3000))  # steps of 0.7..1.1 ms, like the Panda log
    t[1500:] += 8e-3  # one 8.8 ms step: dropped samples, still jitter at 1 kHz
    log = Log(t=t, q=np.sin(t)[:, None])
    assert log.gaps().size == 0 and len(log.segments()) == 1


def test_log_warnings_say_what_the_log_cannot_support():
    from jaxarm.identify.diagnostics import log_warnings

    t = np.arange(0.0, 6.0, 1e-3)
    q = np.stack([np.sin(t), 0.01 * np.sin(t), np.cos(2 * t)], axis=1)  # joint 2 barely moves
    dq = np.gradient(q, t, axis=0)
    tau = np.stack([np.sin(t), np.cos(t), np.clip(3 * np.sin(t), -2.0, 2.0)], axis=1)  # tau3 clipped at +-2
    t = t.copy()
    t[3000:] += 1.0  # a 1 s hole
    notes = log_warnings(Log(t=t, q=q, dq=dq, tau=tau), condition_number=5e3)
    text = "\n".join(notes)
    assert "joint 2 barely moves" in text and "joint 1 barely" not in text and "joint 3 barely" not in text
    assert "tau3 sits at its extreme value 2" in text and "tau3 sits at its extreme value -2" in text
    assert "1 gap(s) in time" in text and "poorly conditioned (condition number 5e+03" in text
    assert len(notes) == 5
    clean = Log(t=np.arange(0.0, 6.0, 1e-3), q=np.sin(np.arange(0.0, 6.0, 1e-3))[:, None])
    assert log_warnings(clean, condition_number=10.0) == []


def test_a_log_in_degrees_is_refused_unless_stated(tmp_path):
    arm = jaxarm.load_arm("panda")  # revolute joints with position limits of about +-2.9 rad
    t = np.arange(0.0, 2.0, 1e-3)
    q = 0.5 * np.sin(np.outer(t, np.arange(1, 8)))
    dq = 0.5 * np.cos(np.outer(t, np.arange(1, 8))) * np.arange(1, 8)
    path = save_log(Log(t=t, q=np.degrees(q), dq=np.degrees(dq), tau=q), tmp_path / "deg.csv")
    with pytest.raises(LogError, match=r"q1: values up to 28.6.*looks like degrees.*angles='degrees'"):
        load_log(path, arm)
    log = load_log(path, arm, angles="degrees")
    np.testing.assert_allclose(log.q, q, atol=1e-12)
    np.testing.assert_allclose(log.dq, dq, atol=1e-12)
    np.testing.assert_array_equal(log.tau, q)  # torques keep their unit
    radians = save_log(Log(t=t, q=q, dq=dq, tau=q), tmp_path / "rad.csv")
    np.testing.assert_array_equal(load_log(radians, arm).q, load_log(radians).q)
    with pytest.raises(ValueError, match="angles"):
        load_log(radians, arm, angles="grad")


def test_column_mapping_reads_a_ros_joint_states_export(tmp_path):
    """``rostopic echo -p /joint_states`` CSV: time in ns, joint names as text, then position,
    velocity and effort arrays numbered from 0. A column map reads it; other columns are ignored."""
    t = np.arange(0.0, 1.0, 1e-2)
    q = np.stack([np.sin(t), np.cos(t)], axis=1)
    header = "%time,field.header.seq,field.name0,field.name1,field.position0,field.position1," \
             "field.velocity0,field.velocity1,field.effort0,field.effort1"
    rows = [f"{int(round(tk * 1e9)) + 1_700_000_000_000_000_000},{k},joint_a,joint_b,{float(q[k, 0])!r},{float(q[k, 1])!r},"
            f"{float(np.cos(tk))!r},{float(-np.sin(tk))!r},{float(2 * q[k, 0])!r},{float(2 * q[k, 1])!r}" for k, tk in enumerate(t)]
    path = tmp_path / "joint_states.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    spec = "t=%time*1e-9,q{j}=field.position{j0},dq{j}=field.velocity{j0},tau{j}=field.effort{j0}"
    log = load_log(path, columns=spec)
    assert log.n == 2 and log.channels == ("q", "dq", "tau")
    np.testing.assert_allclose(log.t - log.t[0], t, atol=1e-6)
    np.testing.assert_array_equal(log.q, q)
    np.testing.assert_array_equal(log.tau, 2 * q)
    arm = jaxarm.load_arm("two_link_planar")
    assert load_log(path, arm, columns=spec).n == 2
    with pytest.raises(LogError, match="q1 is mapped to column 'position_1', which the log does not have"):
        load_log(path, columns="t=%time*1e-9,q1=position_1")
    with pytest.raises(LogError, match="expected t or a channel column"):
        load_log(path, columns="time=%time")
    with pytest.raises(LogError, match="factor must be a number"):
        load_log(path, columns="t=%time*ns")


# --------------------------------------------------------------------------------------------
# Logs read by joint name


def _ros_joint_states(path, t_ns, names_rows, q, dq, tau):
    """A ``rostopic echo -p /joint_states`` CSV: %time in ns, header fields, then name*, position*,
    velocity*, effort* per message (the message's own joint order)."""
    m = q.shape[1]
    header = ["%time", "field.header.seq", "field.header.stamp", "field.header.frame_id"]
    header += [f"field.name{k}" for k in range(m)] + [f"field.position{k}" for k in range(m)]
    header += [f"field.velocity{k}" for k in range(m)] + [f"field.effort{k}" for k in range(m)]
    rows = []
    for i in range(len(t_ns)):
        rows.append([t_ns[i], i, t_ns[i], ""] + list(names_rows[i]) + [repr(float(x)) for x in (*q[i], *dq[i], *tau[i])])
    return _write_csv(path, header, rows)


def test_ros_joint_states_export_is_read_by_joint_name(tmp_path):
    """Joints matched by name message by message (the order changes half-way), time from %time in
    ns, the text columns (names, an empty frame id) not mistaken for numbers; without the names
    the text column is refused with a hint; a joint the messages never name is refused."""
    N = 40
    rng = np.random.default_rng(4)
    t_ns = 1_700_000_000_000_000_000 + np.arange(N) * 2_000_000  # 500 Hz
    truth = {name: rng.normal(size=(N, 3)) for name in ("shoulder", "elbow")}  # q, dq, tau
    order = [("shoulder", "elbow") if i < N // 2 else ("elbow", "shoulder") for i in range(N)]
    q, dq, tau = (np.array([[truth[name][i, c] for name in order[i]] for i in range(N)]) for c in range(3))
    path = _ros_joint_states(tmp_path / "js.csv", t_ns, order, q, dq, tau)
    log = load_log(path, joint_names=("elbow", "shoulder"))
    for c, channel in enumerate(("q", "dq", "tau")):
        np.testing.assert_array_equal(getattr(log, channel), np.stack([truth["elbow"][:, c], truth["shoulder"][:, c]], axis=1))
    # seconds from the first message (float64 holds ns stamps of today to 256 ns)
    assert log.t[0] == 0.0
    np.testing.assert_allclose(np.diff(log.t), 2e-3, atol=5e-7)
    assert "ROS joint_states" in log.info["columns"] and "%time" in log.info["columns"]
    with pytest.raises(LogError, match="holds text.*joint names"):
        load_log(path)
    with pytest.raises(LogError, match="'wrist' is missing"):
        load_log(path, joint_names=("elbow", "wrist"))


def test_columns_named_after_the_joints(tmp_path):
    """One column per joint and quantity, named after a URDF's joints (read with
    urdf_joint_names in chain order); the count must match the arm."""
    urdf = tmp_path / "two.urdf"
    link = '<link name="{0}"><inertial><mass value="1"/><inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial></link>'
    joint = ('<joint name="{0}" type="revolute"><parent link="{1}"/><child link="{2}"/><origin xyz="0 0 0.3"/>'
             '<axis xyz="0 1 0"/><limit lower="-2" upper="2" effort="50" velocity="2"/></joint>')
    urdf.write_text('<robot name="two"><link name="base"/>' + link.format("l1") + link.format("l2")
                    + joint.format("hip", "base", "l1") + joint.format("knee", "l1", "l2") + "</robot>")
    names = jaxarm.urdf.urdf_joint_names(urdf)
    assert names == ("hip", "knee")
    arm = jaxarm.load_arm(urdf)
    rng = np.random.default_rng(1)
    data = rng.uniform(-1, 1, (30, 6))
    header = ["time", "knee", "hip", "hip_velocity", "knee_velocity", "hip_effort", "knee_effort"]
    rows = [[0.01 * i, *data[i]] for i in range(30)]
    path = _write_csv(tmp_path / "named.csv", header, rows)
    log = load_log(path, arm, joint_names=names)
    np.testing.assert_array_equal(log.q, data[:, [1, 0]])
    np.testing.assert_array_equal(log.dq, data[:, [2, 3]])
    np.testing.assert_array_equal(log.tau, data[:, [4, 5]])
    assert "matched by joint name" in log.info["columns"]
    with pytest.raises(LogError, match="3 names for the 2 joints"):
        load_log(path, arm, joint_names=("hip", "knee", "ankle"))
    with pytest.raises(LogError, match="no position column for joint 'ankle'"):
        load_log(path, joint_names=("hip", "ankle"))


def test_an_empty_numeric_column_is_not_mistaken_for_text(tmp_path):
    """A column of NaNs (a channel never written) is reported as NaN values by line, as before the
    reader learned to keep text columns."""
    path = _write_csv(tmp_path / "nan.csv", ["t", "q1", "tau1"], [[0.0, 0.1, "nan"], [0.001, 0.2, "nan"]])
    with pytest.raises(LogError, match="NaN/inf values"):
        load_log(path)
