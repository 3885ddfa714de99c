"""The explorer container: controls, a text readout and a chart redrawn in place.

``explorer_class()`` gives the ``Explorer`` class (an ipywidgets VBox, defined on first use so
that importing this module needs no ipywidgets). widgets/explorers.py builds the course's four explorers on
it; each has ``.controls`` (name -> widget), ``.readout`` (an HTML widget), ``.output`` (the
chart), ``.figure`` and ``.redraw()``.

Redrawing: one matplotlib Figure per explorer is reused; a change updates its artists (bar
heights, texts, limits), renders it to PNG and replaces the contents of one ``Output`` widget of
fixed height in a single step (what ``clear_output(wait=True)`` followed by ``display(fig)``
does), so the page neither flickers nor jumps. ipympl is not used (it does not work on Colab).
An explorer given ``static_key`` and ``live`` repaints only its live artists over a saved
picture of the rest while the key stays the same (same pixels as a full draw;
``benchmarks/redraw.py`` times it); the pictures of the last SAVED_BACKGROUNDS keys are kept,
so going back to an earlier state (one method, another, the first again) draws no axes. An
explorer given ``rows`` (bands of a chart no other row reaches) also keeps a picture of each
row it painted, so a row that shows what it showed before is put back, not drawn. A control
that moves another (``link``) redraws once.
A callback never raises: a failing update is shown as a message in the readout. A Reset button
(``.reset()``) puts every control back where the explorer started, with one redraw, so a live
demonstration can start again from the notebook's settings.

Where no widget frontend exists: displaying an explorer puts a PNG of its current chart in the
same output as the widget view. JupyterLab, Colab, Kaggle and VS Code show the live widget;
GitHub's viewer, nbconvert without widget state and an untrusted reopened notebook show the PNG.
With the environment variable ``LESSONKIT_STATIC=1`` (e.g. for papermill or nbval runs)
explorers display only the PNG and the readout text.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable
from typing import Any

from ..errors import LessonkitError

CHART_DPI = 100
SAVED_BACKGROUNDS = 8  # per explorer, about 1 MB each
SAVED_ROWS = 200  # bands of a chart's rows, about 50 kB each
NO_CHART = "No chart for this combination: the message above says why."


def static_mode() -> bool:
    """True when explorers should display a plain picture only (LESSONKIT_STATIC=1)."""
    return os.environ.get("LESSONKIT_STATIC", "").strip().lower() in ("1", "true", "yes", "on")


def _error_html(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, LessonkitError) else f"{type(exc).__name__}: {exc}"
    return (
        f"<div style='color:#B22222'><b>Cannot show this combination.</b> {html.escape(text)}</div>"
    )


_EXPLORER_CLASS: Any = None


def explorer_class() -> Any:
    """The Explorer class (defined on first use, so importing this module needs no ipywidgets)."""
    global _EXPLORER_CLASS
    if _EXPLORER_CLASS is not None:
        return _EXPLORER_CLASS
    import ipywidgets as W

    class Explorer(W.VBox):
        """Controls, a text readout and a chart that redraws in place when a control changes."""

        def __init__(
            self,
            kind: str,
            controls: dict[str, Any],
            update: Callable[[Any], str],
            figure: Any,
            layout_rows: list[list[str]],
            static_key: Callable[[], Any] | None = None,
            live: Callable[[], list[Any]] | None = None,
            link: Callable[[Any], None] | None = None,
            **attributes: Any,
        ) -> None:
            for key, value in attributes.items():
                setattr(self, key, value)
            self.controls = controls
            self.figure = figure
            self._update = update
            self.readout = W.HTML(layout=W.Layout(min_height="3.2em"))
            self.readout.add_class("lessonkit-readout")
            width, height = (int(v * CHART_DPI) for v in figure.get_size_inches())
            self.output = W.Output(
                layout=W.Layout(height=f"{height + 8}px", width=f"{width + 8}px", overflow="hidden")
            )
            self.output.add_class("lessonkit-chart")
            self.error: BaseException | None = None
            self._png = b""
            self._static_key = static_key if live is not None else None
            self._live = live
            self._link = link
            self._linking = False
            self._backgrounds: dict[Any, Any] = {}  # static key -> saved picture, newest last
            self._frame: Any = None
            self._rows: Callable[[], list[Any]] | None = None
            self._row_pictures: dict[Any, Any] = {}  # (static key, row key) -> saved band
            self._frame_key: Any = None
            boxes = [W.HBox([controls[n] for n in row if n in controls]) for row in layout_rows]
            self.initial = {name: control.value for name, control in controls.items()}
            self.reset_button = W.Button(
                description="Reset",
                icon="undo",
                tooltip="Put every control back where it started",
                layout=W.Layout(width="auto"),
            )
            self.reset_button.add_class("lessonkit-button-reset")
            self.reset_button.on_click(lambda _button: self.reset())
            super().__init__([*boxes, W.HBox([self.reset_button]), self.readout, self.output])
            self.add_class("lessonkit-explorer")
            self.add_class(f"lessonkit-{kind}-explorer")
            for control in controls.values():
                control.observe(self._on_change, names="value")
            self.redraw()

        def _on_change(self, change: Any) -> None:
            # A change that moves other controls (``link``) redraws once, after all of them.
            if self._linking:
                return
            if self._link is not None:
                self._linking = True
                try:
                    self._link(change)
                except Exception as exc:  # shown, never raised
                    self._show_error(exc)
                    return
                finally:
                    self._linking = False
            self.redraw()

        def reset(self) -> None:
            """Put every control back to its starting value and redraw once; never raises."""
            self._linking = True  # no link and no redraw while the values are put back
            try:
                for name, value in self.initial.items():
                    self.controls[name].value = value
            except Exception as exc:  # shown, never raised
                self.error = exc
                self.readout.value = _error_html(exc)
                return
            finally:
                self._linking = False
            if getattr(self, "report", None) is not None:
                self.report = None  # a fresh start: the readout compares with no earlier state
            self.redraw()

        def redraw(self) -> None:
            """Recompute, update the chart's artists and show the new picture; never raises."""
            try:
                readout = self._update(self)
                png = self.png()
            except Exception as exc:  # a callback must not raise in front of a class
                self._show_error(exc)
                return
            self.error = None
            self.readout.value = readout
            self._png = png
            data = {
                "image/png": base64.b64encode(png).decode("ascii"),
                "text/plain": "<lessonkit chart>",
            }
            self.output.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

        def _show_error(self, exc: BaseException) -> None:
            """The message in the readout, and no chart: the previous one would show its bars
            under settings they do not belong to."""
            self.error = exc
            self.readout.value = _error_html(exc)
            self._png = b""
            self.output.outputs = ({"output_type": "stream", "name": "stdout", "text": NO_CHART},)

        def png(self) -> bytes:
            """The figure as it is now, as PNG bytes."""
            canvas = self.figure.canvas
            key = self._static_key() if self._static_key is not None else None
            if key is None:
                canvas.draw()
            else:
                # Paint only the live artists over a saved picture of everything else. Such a
                # picture is kept for each of the last few keys (the key says what the rest
                # shows: limits, labels), so going back to an earlier state (another method and
                # back) reuses it. A new one is taken over a saved picture of the figure without
                # its axes (the legend), which is taken again when the legend changes (key[0]).
                live = self._live()
                background = self._backgrounds.pop(key, None)
                if background is None:
                    if self._frame is None or key[0] != self._frame_key:
                        for ax in self.figure.axes:
                            ax.set_visible(False)
                        try:
                            canvas.draw()
                        finally:
                            for ax in self.figure.axes:
                                ax.set_visible(True)
                        self._frame = canvas.copy_from_bbox(self.figure.bbox)
                        self._frame_key = key[0]
                        self._backgrounds.clear()  # they hold the old frame
                    canvas.restore_region(self._frame)
                    renderer = canvas.get_renderer()
                    for artist in live:
                        artist.set_animated(True)  # left out of the axes' draw
                    try:
                        for ax in self.figure.axes:
                            ax.draw(renderer)
                    finally:
                        for artist in live:
                            artist.set_animated(False)
                    background = canvas.copy_from_bbox(self.figure.bbox)
                    while len(self._backgrounds) >= SAVED_BACKGROUNDS:
                        self._backgrounds.pop(next(iter(self._backgrounds)))
                self._backgrounds[key] = background
                canvas.restore_region(background)
                self._paint(key, live)
            from PIL import Image

            width, height = canvas.get_width_height()
            image = Image.frombuffer(
                "RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1
            )
            if self.figure.get_facecolor()[3] == 1:  # opaque: RGB is the same picture, smaller
                image = image.convert("RGB")
            buffer = io.BytesIO()
            image.save(buffer, format="png", compress_level=1)
            return buffer.getvalue()

        def _paint(self, key: Any, live: list[Any]) -> None:
            """Draw the live artists over the restored background. With ``rows`` (bands that
            no other row's artists reach: (row key, display bbox, artists)), a band whose row
            key was painted before under the same static key is put back from its saved
            picture instead of drawn; the other live artists (drawn across every band, e.g. a
            spine) are drawn first, so the saved bands hold them too."""
            canvas = self.figure.canvas
            renderer = canvas.get_renderer()
            rows = self._rows() if self._rows is not None else []
            saved = [(self._row_pictures.get((key, r[0])), r) for r in rows]
            skip = {id(a) for picture, r in saved if picture is not None for a in r[2]}
            for artist in live:
                if id(artist) not in skip:
                    artist.draw(renderer)
            for picture, (row_key, bbox, _artists) in saved:
                if picture is None:
                    while len(self._row_pictures) >= SAVED_ROWS:
                        self._row_pictures.pop(next(iter(self._row_pictures)))
                    self._row_pictures[(key, row_key)] = canvas.copy_from_bbox(bbox)
                else:
                    canvas.restore_region(picture)

        def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
            parent = getattr(super(), "_repr_mimebundle_", None)
            if parent is not None:  # ipywidgets 8
                bundle = dict(parent(**kwargs) or {})
            else:  # ipywidgets 7 (Colab) builds its bundle inside _ipython_display_
                bundle = {
                    "text/plain": repr(self)[:110],
                    "application/vnd.jupyter.widget-view+json": {
                        "version_major": 2,
                        "version_minor": 0,
                        "model_id": self._model_id,
                    },
                }
            if self.error is None:
                bundle["image/png"] = base64.b64encode(self._png or self.png()).decode("ascii")
            if static_mode():
                bundle.pop("application/vnd.jupyter.widget-view+json", None)
                bundle["text/plain"] = _plain_text(self.readout.value)
            return bundle

        if hasattr(W.Widget, "_ipython_display_"):  # ipywidgets 7 displays through this hook

            def _ipython_display_(self, **kwargs: Any) -> None:
                from IPython.display import display

                bundle = self._repr_mimebundle_()
                display(bundle, raw=True)
                if "application/vnd.jupyter.widget-view+json" in bundle:
                    self._handle_displayed(**kwargs)

    _EXPLORER_CLASS = Explorer
    return Explorer


def _plain_text(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<br\s*/?>", "\n", re.sub(r"<(?!br)[^>]+>", "", markup)))


def new_figure(width: float, height: float, **adjust: float) -> Any:
    """A matplotlib Figure on an Agg canvas (no pyplot, no display needed), CHART_DPI dots."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=CHART_DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**adjust)
    return fig
