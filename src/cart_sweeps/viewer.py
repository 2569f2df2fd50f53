"""`python -m cart_sweeps.viewer stage=<name> [--port N]`: a stage's loss, rho and validation PPL in a browser,
served from its run folders, where W&B cannot be reached.

No logger is needed: every run writes metrics.jsonl whatever `logger` is, so the viewer reads the folders at each
request (a stage still training shows its newest steps on reload) and needs nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.config import ConfigError
from cart_sweeps.naming import runs_of_named_stage
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import METRICS

USAGE = """usage: python -m cart_sweeps.viewer stage=<name> [OVERRIDE ...] [--port N]

Serves the stage's training loss, rho and validation PPL against step, one line per run folder, at
http://127.0.0.1:N/ (default 6006; 0 picks a free port), and the numbers as JSON at /series.json.
  python -m cart_sweeps.viewer stage=1 scale=tiny
"""

PANELS = {"train": ["loss", "rho"], "eval": ["ppl"]}  # the row kind and the keys (ppl: each validation set's)


def series(stage_dir: Path) -> dict[str, dict[str, list[list[float]]]]:
    """Run folder name -> metric -> [[step, value], ...]: train loss and rho, and ppl_<set> from the eval rows."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for path in sorted(stage_dir.glob(f"*/{METRICS}")):
        run: dict[str, list[list[float]]] = {}
        for row in read_metrics(path):
            for key, value in row.items():
                shown = key in PANELS["train"] if row.get("kind") == "train" else key.startswith("ppl_")
                if shown and isinstance(value, int | float):
                    run.setdefault(key, []).append([row["step"], value])
        out[path.parent.name] = run
    return out


PAGE = """<!doctype html><meta charset="utf-8"><title>stage %(stage)s</title>
<style>body{font:14px sans-serif;margin:20px}svg{border:1px solid #ccc;margin:6px}</style>
<h1>stage %(stage)s: loss, rho and validation PPL against step</h1><div id="plots"></div>
<script>
const COLORS = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f","#bcbd22","#17becf"];
fetch("series.json").then(r => r.json()).then(runs => {
  const names = Object.keys(runs);
  const metrics = [...new Set(names.flatMap(n => Object.keys(runs[n])))].sort((a, b) =>
    (a === "loss" ? -2 : a === "rho" ? -1 : 0) - (b === "loss" ? -2 : b === "rho" ? -1 : 0) || a.localeCompare(b));
  for (const metric of metrics) {
    const lines = names.filter(n => runs[n][metric]).map(n => [n, runs[n][metric]]);
    const pts = lines.flatMap(([, p]) => p);
    const [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
    const [y0, y1] = [Math.min(...pts.map(p => p[1])), Math.max(...pts.map(p => p[1]))];
    const X = x => 50 + 540 * (x - x0) / ((x1 - x0) || 1), Y = y => 260 - 220 * (y - y0) / ((y1 - y0) || 1);
    let svg = `<svg width="820" height="300"><text x="50" y="20">${metric}</text>` +
      `<text x="5" y="45">${y1.toPrecision(4)}</text><text x="5" y="260">${y0.toPrecision(4)}</text>` +
      `<text x="50" y="290">step ${x0}</text><text x="540" y="290">${x1}</text>`;
    lines.forEach(([name, p], i) => {
      const c = COLORS[i %% COLORS.length];
      svg += `<polyline fill="none" stroke="${c}" points="${p.map(q => X(q[0]) + "," + Y(q[1])).join(" ")}"/>` +
        `<text x="600" y="${40 + 16 * i}" fill="${c}">${name}</text>`;
    });
    document.getElementById("plots").insertAdjacentHTML("beforeend", svg + "</svg>");
  }
});
</script>
"""


def handler(stage: str, stage_dir: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] == "/series.json":
                self._send("application/json", json.dumps(series(stage_dir)))
            elif self.path.split("?")[0] in ("/", "/index.html"):
                self._send("text/html; charset=utf-8", PAGE % {"stage": stage})
            else:
                self.send_error(404)

        def _send(self, kind: str, text: str) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass  # one line per request would bury the address

    return Handler


def serve(overrides: list[str], port: int) -> None:
    cfg = compose_config(overrides)
    stage_dir = runs_of_named_stage(cfg, "show")
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler(cfg.stage.name, stage_dir))
    except OSError as err:
        raise ConfigError(f"--port {port}: {err.strerror}; choose another port (--port 0 picks a free one)") from err
    print(f"stage {cfg.stage.name}: serving loss and rho at http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--port", type=int, default=6006)
    known, rest = flags.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    run_cli(lambda overrides: serve(overrides, known.port), USAGE, rest)


if __name__ == "__main__":
    main()
