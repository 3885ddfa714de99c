"""The explorer container: controls, a text readout and a chart redrawn in place.

``explorer_class()`` gives the ``Explorer`` class (an ipywidgets VBox, defined on first use so
that importing this module needs no ipywidgets). widgets/explorers.py builds the course's
explorers on it; each has ``.controls`` (name -> widget), ``.readout`` (an HTML widget),
``.image`` (the chart: an ``Image`` widget of PNG bytes), ``.output`` (the fixed-size box that
holds it), ``.figure`` and ``.redraw()``. It works with ipywidgets 7.7 (Colab; classic
Notebook, where widgetsnbextension 3.6.7-3.6.10 leaves every ``Output`` widget blank) and 8.x.

Redrawing: one matplotlib Figure per explorer is reused; a change updates its artists (bar
heights, texts, limits), renders it to PNG and sets the Image's bytes in a single step, in a
box of fixed size, so the page neither flickers nor jumps. ipympl is not used (it does not
work on Colab).
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

Where no kernel or no widget front end is there: displaying an explorer puts two outputs in
its cell, the widget and a static copy (``static_bundle``: the readout and the chart as HTML,
the chart as PNG), kept at the explorer's current state. The live widget hides the static copy
(a CSS rule inside it); a saved notebook reopened without its kernel, GitHub's viewer and
nbconvert show the static copy. With the environment variable ``LESSONKIT_STATIC=1`` (e.g.
for papermill or nbval runs) explorers display only the static copy.
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
# Shown inside the live widget only: hides the static copy in the same cell's outputs
# (JupyterLab, Notebook 7 and Voila; classic Notebook; Colab and VS Code per output).
STATIC_RULE = (
    "<style>.jp-OutputArea:has(.lessonkit-explorer) .lessonkit-static,"
    ".output:has(.lessonkit-explorer) .lessonkit-static,"
    ".output_area:has(.lessonkit-explorer) ~ .output_area .lessonkit-static,"
    "body:has(.lessonkit-explorer) > .lessonkit-static,"
    "body:has(.lessonkit-explorer) > div > .lessonkit-static{display:none}</style>"
)


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

    class Explorer(W.VBox):  # type: ignore[misc]  # ipywidgets has no type hints
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
            # The chart is an Image widget (PNG bytes): it shows in every front end, classic
            # Notebook with widgetsnbextension 3.6.10 included, where Output widgets stay blank.
            self.image = W.Image(
                format="png", layout=W.Layout(width=f"{width}px", height=f"{height}px")
            )
            self.no_chart = W.HTML(NO_CHART, layout=W.Layout(display="none"))
            self.output = W.Box(
                [self.image, self.no_chart],
                layout=W.Layout(
                    height=f"{height + 8}px", width=f"{width + 8}px", overflow="hidden"
                ),
            )
            self.output.add_class("lessonkit-chart")
            # Hides the static copy (``static_bundle``) of a live explorer; without a kernel
            # the widget, and so this rule, is not drawn and the static copy shows.
            self.static_rule = W.HTML(STATIC_RULE, layout=W.Layout(display="none"))
            self._static_handle: Any = None
            self.notes = W.HTML(layout=W.Layout(display="none"))  # reasons, where no tooltips
            self.notes.add_class("lessonkit-notes")
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
            self._encoded: dict[Any, bytes] = {}  # static key -> PNG, where nothing is live
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
            super().__init__(
                [
                    self.static_rule,
                    *boxes,
                    self.notes,
                    W.HBox([self.reset_button]),
                    self.readout,
                    self.output,
                ]
            )
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
            self.image.value = png
            self._show_chart(True)

        def _show_chart(self, shown: bool) -> None:
            if (self.image.layout.display != "none") != shown:
                self.image.layout.display = None if shown else "none"
                self.no_chart.layout.display = "none" if shown else None
            self._update_static()

        def _show_error(self, exc: BaseException) -> None:
            """The message in the readout, and no chart: the previous one would show its bars
            under settings they do not belong to."""
            self.error = exc
            self.readout.value = _error_html(exc)
            self._png = b""
            self._show_chart(False)

        def static_bundle(self) -> dict[str, Any]:
            """What a front end without a kernel shows: the readout and the chart as HTML
            (class ``lessonkit-static``), the chart as PNG, the readout as text."""
            png = base64.b64encode(self._png).decode("ascii") if self.error is None else ""
            picture = (
                f"<img src='data:image/png;base64,{png}' alt='chart'>"
                if png
                else f"<p>{html.escape(NO_CHART)}</p>"
            )
            bundle = {
                "text/html": f"<div class='lessonkit-static'>{self.readout.value}"
                f"<br>{picture}</div>",
                "text/plain": _plain_text(self.readout.value),
            }
            if png:
                bundle["image/png"] = png
            return bundle

        def _update_static(self) -> None:
            """Keep the static copy shown beside the widget at the current state, so that a
            saved notebook holds what the explorer showed last."""
            if self._static_handle is not None:
                try:
                    self._static_handle.update(self.static_bundle(), raw=True)
                except Exception:  # a closed front end: the live widget still works
                    self._static_handle = None

        def png(self) -> bytes:
            """The figure as it is now, as PNG bytes."""
            canvas = self.figure.canvas
            key = self._static_key() if self._static_key is not None else None
            if key is not None and key in self._encoded:  # nothing live: the same picture
                return bytes(self._encoded[key])
            if key is None:
                canvas.draw()
            else:
                # Paint only the live artists over a saved picture of everything else. Such a
                # picture is kept for each of the last few keys (the key says what the rest
                # shows: limits, labels), so going back to an earlier state (another method and
                # back) reuses it. A new one is taken over a saved picture of the figure without
                # its axes (the legend), which is taken again when the legend changes (key[0]).
                live = self._live() if self._live is not None else []
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
            png = buffer.getvalue()
            if key is not None and self._live is not None and not self._live():
                while len(self._encoded) >= SAVED_BACKGROUNDS:
                    self._encoded.pop(next(iter(self._encoded)))
                self._encoded[key] = png  # e.g. the decision flow: one picture per path
            return png

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
            """The widget view alone (its static copy is an output of its own, see
            ``_ipython_display_``); with LESSONKIT_STATIC=1 the static copy only."""
            if static_mode():
                return self.static_bundle()
            return {
                "text/plain": "",  # a viewer without widgets shows the static copy instead
                "application/vnd.jupyter.widget-view+json": {
                    "version_major": 2,
                    "version_minor": 0,
                    "model_id": self._model_id,
                },
            }

        def _ipython_display_(self, **kwargs: Any) -> None:
            """Two outputs: the live widget, then its static copy (readout and chart), which a
            live widget hides and which is kept up to date, so a saved notebook opened
            without a kernel (or on GitHub, or after nbconvert) shows both."""
            from IPython import display as ipython_display

            display: Any = ipython_display.display
            if static_mode():
                display(self.static_bundle(), raw=True)
                return
            display(self._repr_mimebundle_(), raw=True)
            handle_displayed = getattr(self, "_handle_displayed", None)  # ipywidgets 7
            if handle_displayed is not None:
                handle_displayed(**kwargs)
            self._static_handle = display(self.static_bundle(), raw=True, display_id=True)

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
