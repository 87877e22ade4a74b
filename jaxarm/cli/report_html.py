"""``jaxarm identify --html``: the identification report as one self-contained HTML page.

Everything a person checks before trusting an identified model, on one page that opens offline
(figures are PNGs embedded as data URIs, no scripts, no external files): the verdict with its
thresholds, the decisions the command made from the data and why, per-joint measured vs predicted
torques on the fitted and the held-out part, residual histograms and spectra, the error table,
the parameters with their standard deviations, the consistency of every body and drive, and the
warnings. The JSON report is embedded too (``<script type="application/json" id="report">``),
so the page is also machine-readable.
"""

from __future__ import annotations

import base64
import html
import io
import json

import numpy as np


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _torque_figure(t, measured, predicted, title):
    import matplotlib.pyplot as plt

    n = measured.shape[1]
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.5 * n + 0.9), sharex=True, squeeze=False)
    for j, ax in enumerate(axes[:, 0]):
        ax.plot(t, measured[:, j], color="0.55", lw=0.7, label="measured")
        ax.plot(t, predicted[:, j], color="C0", lw=0.8, label="identified model")
        ax.set_ylabel(f"tau{j + 1} [N m]", fontsize=8)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=2)
    axes[0, 0].set_title(title, fontsize=10)
    axes[-1, 0].set_xlabel("t [s]")
    fig.tight_layout()
    return _png(fig)


def _residual_figures(residual, rate):
    """Histograms and power spectral densities (Welch) of the held-out residual per joint."""
    import matplotlib.pyplot as plt
    from scipy import signal

    n = residual.shape[1]
    fig, axes = plt.subplots(1, n, figsize=(2.0 * n + 1, 2.4), squeeze=False)
    for j, ax in enumerate(axes[0]):
        ax.hist(residual[:, j], bins=40, color="C1")
        ax.set_title(f"joint {j + 1}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("samples", fontsize=8)
    fig.suptitle("held-out residual (measured - predicted) [N m]", fontsize=9)
    fig.tight_layout()
    hist = _png(fig)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for j in range(n):
        f, p = signal.welch(residual[:, j], fs=rate, nperseg=min(1024, residual.shape[0]))
        ax.semilogy(f, p, lw=0.8, label=f"joint {j + 1}")
    ax.set_xlabel("frequency [Hz]")
    ax.set_ylabel("PSD [(N m)^2 / Hz]")
    ax.set_title("held-out residual spectrum: a flat floor is sensor noise, peaks are unmodelled effects", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    return hist, _png(fig)


def _table(header, rows, klass="") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{klass}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _fmt(x, digits=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return str(x)


_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.85em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.pass{color:#1a7f37;font-weight:bold}
.fail{color:#c62828;font-weight:bold}img{max-width:100%;display:block;margin:.5em 0}.note{color:#555;font-size:.9em}
"""


def identify_html(report: dict, fitted, fit_log, held_log, predicted_fit, predicted_held) -> str:
    """The HTML page of a ``jaxarm identify`` run: ``report`` (the JSON report's dict), the fitted
    arm, the preprocessed fitted and held-out logs and the model's torques on each."""
    import matplotlib

    matplotlib.use("Agg")
    verdict = report["verdict"]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>jaxarm identify: {html.escape(report['arm'])}</title>"
             f"<style>{_STYLE}</style></head><body>"]
    parts.append(f"<h1>Identification of {html.escape(report['arm'])}</h1>")
    log = report["log"] if isinstance(report["log"], str) else ", ".join(report["log"])
    parts.append(f"<p>Log: <code>{html.escape(log)}</code>. Method: {html.escape(report['method'])}, friction: "
                 f"{html.escape(report['friction'])}. {report['samples']['fit']} samples fitted, {report['samples']['heldout']} held out.</p>")
    word = "pass" if verdict["pass"] else "FAIL"
    parts.append(f"<h2>Verdict: <span class='{'pass' if verdict['pass'] else 'fail'}'>{word}</span></h2>")
    rows = []
    for c in verdict["checks"]:
        detail = {k: v for k, v in c.items() if k not in ("check", "pass")}
        rows.append([c["check"], "pass" if c["pass"] else "FAIL", json.dumps(detail)[:160]])
    parts.append(_table(["check", "result", "threshold and values"], rows, "verdict"))

    parts.append("<h2>Decisions made from the data</h2><ul>")
    v = report["validation"]
    parts.append(f"<li>Validation: {html.escape(v['how'])} (split at t = {v['split_at']:.4g} s, "
                 f"{100 * v['heldout_fraction']:.0f} % held out {v['heldout']}).</li>")
    if report.get("selection"):
        parts.append(f"<li>Preprocessing: {html.escape(report['selection']['reason'])}.</li>")
    pre = report["preprocessing"]
    parts.append(f"<li>Filter: {html.escape(str(pre.get('cutoff')))} Hz cutoff; velocities "
                 f"{html.escape(str(pre.get('velocity')))}; rate {_fmt(pre.get('rate'))} Hz.</li>")
    reg = report.get("regularization") or {}
    if reg.get("reason"):
        parts.append(f"<li>{html.escape(reg['reason'])}.</li>")
    elif reg.get("weight") is not None:
        parts.append(f"<li>Regularization weight {_fmt(reg['weight'])} (given).</li>")
    parts.append(f"<li>Coulomb friction shape per joint (velocity scale, 0 = sign): {html.escape(str(report['coulomb_velocity_scale']))}.</li>")
    if report.get("output_error"):
        parts.append(f"<li>Output-error refinement: {html.escape(report['output_error']['decision'])}.</li>")
    if report.get("friction_models"):
        parts.append(f"<li>Friction model per joint: {html.escape('; '.join(report['friction_models']))}.</li>")
    parts.append("</ul>")
    if report.get("selection"):
        cands = report["selection"]["candidates"]
        rows = [[_fmt(c["cutoff_hz"]) if c["cutoff_hz"] is not None else "none", _fmt(c["coulomb_scale"]),
                 _fmt(c.get("stribeck_velocity", 0.0)), _fmt(c["score"]),
                 "best" if c["best_score"] else "", ", ".join(map(str, c["chosen_for_joints"]))] for c in cands]
        parts.append("<details><summary>Every candidate's cross-validated error</summary>"
                     + _table(["cutoff [Hz]", "Coulomb scale", "Stribeck velocity (0 = none)", "relative validation error", "",
                               "model chosen for joints"], rows) + "</details>")

    n = fitted.n
    r = report["rmse"]
    start = next((c for c in verdict["checks"] if "ratio" in c), None)
    rows = [[f"joint {j + 1}", _fmt(r["fit"][j]), _fmt(r["heldout"][j]), _fmt(start["ratio"][j]) if start else "-"] for j in range(n)]
    parts.append("<h2>Torque errors</h2>" + _table(["", "RMSE fitted part [N m]", "RMSE held-out [N m]", "held-out / starting arm"], rows))
    parts.append(f"<p class='note'>Held-out torques are compared as measured ({html.escape(r['heldout_torque'])}); "
                 f"the fitted part's torques are {html.escape(r['fit_torque'])}.</p>")
    parts.append(f"<img alt='torques on the fitted part' src='{_torque_figure(fit_log.t, fit_log.tau, predicted_fit, 'fitted part')}'>")
    parts.append(f"<img alt='torques on the held-out part' src='{_torque_figure(held_log.t, held_log.tau, predicted_held, 'held-out part')}'>")
    rate = 1.0 / float(np.median(np.diff(held_log.t))) if len(held_log) > 1 else 1.0
    hist, psd = _residual_figures(held_log.tau - predicted_held, rate)
    parts.append(f"<img alt='residual histograms' src='{hist}'><img alt='residual spectra' src='{psd}'>")

    parts.append("<h2>Parameters</h2>")
    lin = report["linear"]
    parts.append(f"<p>{html.escape(report['identifiability']['summary'])}</p>")
    parts.append(f"<p>Base regressor: rank {lin['rank']}, condition number {_fmt(lin['condition_number'])} "
                 f"({_fmt(lin['condition_number_scaled'])} with scaled columns).</p>")
    rows = [[b["combination"], _fmt(b["value"]), _fmt(b["std"]), _fmt(b["relative_std_percent"], 3)] for b in lin["base_parameters"]]
    parts.append("<details><summary>Base parameters (linear fit) with standard deviations</summary>"
                 + _table(["combination", "value", "std", "std [%]"], rows) + "</details>")
    links, drives = fitted.links, fitted.drives
    rows = []
    for i in range(n):
        inertia = np.asarray(links.inertia[i])
        rows.append([f"link {i + 1}", _fmt(links.mass[i]), " ".join(_fmt(x, 3) for x in np.asarray(links.com[i])),
                     " ".join(_fmt(x, 3) for x in (inertia[0, 0], inertia[1, 1], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]))])
    parts.append(_table(["", "mass [kg]", "COM [m]", "Ixx Iyy Izz Ixy Ixz Iyz about the COM [kg m^2]"], rows))
    tc = np.asarray(drives.coulomb_friction)
    rows = [[f"drive {j + 1}", _fmt(drives.rotor_inertia[j]), _fmt(drives.viscous_friction[j]), _fmt(tc[j, 0]), _fmt(tc[j, 1]),
             _fmt(drives.coulomb_velocity_scale[j]), _fmt(drives.static_friction[j]), _fmt(drives.stribeck_velocity[j])] for j in range(n)]
    parts.append(_table(["", "rotor inertia", "viscous", "Tc+", "Tc-", "Coulomb scale", "static Ts (Stribeck)", "Stribeck velocity"], rows))

    parts.append("<h2>Physical consistency</h2>")
    rows = [[label, "ok" if v["ok"] else "NO", "; ".join(v["problems"])] for label, v in report["consistency"].items()]
    parts.append(_table(["body / drive", "consistent", "problems"], rows))
    if report.get("exports"):
        rows = [[path, e["checked_by"] or "not checked", _fmt(max(e["torque_difference_rms"])) if e["torque_difference_rms"] else "-",
                 "; ".join(e["lost"])] for path, e in report["exports"].items()]
        parts.append("<h2>Exported files</h2>" + _table(["file", "read back by", "largest RMS torque difference [N m]", "not held by the format"], rows))
    parts.append("<h2>Warnings</h2>" + ("<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in report["warnings"]) + "</ul>"
                                          if report["warnings"] else "<p>None.</p>"))
    payload = json.dumps(report).replace("</", "<\\/")
    parts.append(f"<script type='application/json' id='report'>{payload}</script></body></html>\n")
    return "".join(parts)
