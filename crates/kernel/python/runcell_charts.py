"""Chart data of matplotlib figures (issue 24): what a figure plots, as JSON a model or a UI can
read instead of guessing values from the PNG's pixels.

The shape follows E2B's chart objects: {type, title, x_label, y_label, x_unit, y_unit,
x_ticks, x_tick_labels, x_scale, y_ticks, y_tick_labels, y_scale, elements}, with `type` one of
line, scatter, bar, pie, box_and_whisker, histogram, unknown; a figure of several axes is a
`superchart` whose elements are charts. Pie charts carry only type, title and elements.

Element shapes: line/scatter {label, points: [[x, y], ...]}; bar {label, group, value};
histogram {label, bin_edges, counts}; pie {label, angle (degrees), radius};
box_and_whisker {label, min, first_quartile, median, third_quartile, max, outliers}.

Robustness is the rule: an axes that cannot be classified is `unknown` (its labels and ticks,
no elements), and any failure makes the figure chartless; a cell never fails over its chart.
Stdlib only at import: matplotlib is looked up when a figure is converted (the kernel runs
without it too).
"""

import datetime
import math
import re
import sys

# The transport key inside a result's MIME bundle; the host moves it to `result.chart`.
CHART_MIME = "application/vnd.runcell.chart+json"

MAX_POINTS = 10_000  # per element: a million-point line is not data a model reads
MAX_ELEMENTS = 1_000  # per chart
# Per figure, over all its series: what keeps a chart well inside a result's size cap (a
# chart past the bundle's text limit would be dropped whole). Past it, each series keeps an
# even share of its points, first points first.
MAX_FIGURE_POINTS = 50_000
# "Duration (s)" or "Price [USD]": the unit is what the parentheses or brackets hold.
_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def figure_chart(figure):
    """The chart dict of a matplotlib figure, or None (no data, or extraction failed)."""
    try:
        axes = [ax for ax in figure.get_axes() if not _is_decoration(ax)]
        if not axes or not any(ax.has_data() for ax in axes):
            return None
        if len(axes) == 1:
            chart = axes_chart(axes[0])
        else:
            title = _suptitle(figure)
            chart = {"type": "superchart", "title": title, "elements": [axes_chart(ax) for ax in axes]}
        _bound_points(chart)
        return chart
    except Exception:
        return None


def _bound_points(chart):
    """Cut the series of `chart` to MAX_FIGURE_POINTS points in all (see there)."""
    charts = chart["elements"] if chart["type"] == "superchart" else [chart]
    series = [e for c in charts for e in c.get("elements", ()) if "points" in e]
    total = sum(len(e["points"]) for e in series)
    if total <= MAX_FIGURE_POINTS:
        return
    share = max(1, MAX_FIGURE_POINTS // len(series))
    for e in series:
        del e["points"][share:]


def axes_chart(ax):
    """One axes' chart; `unknown` with no elements when its content has no known shape or
    reading it fails."""
    try:
        kind, elements = _classify(ax)
    except Exception:
        kind, elements = "unknown", []
    if kind == "pie":
        return {"type": "pie", "title": _text(ax.get_title()), "elements": elements}
    chart = {"type": kind, "title": _text(ax.get_title())}
    try:
        chart.update(_axes_info(ax))
    except Exception:
        chart.update(_empty_axes_info())
    chart["elements"] = elements[:MAX_ELEMENTS]
    return chart


# ---- classification -------------------------------------------------------------------------


def _classify(ax):
    import matplotlib.collections as mcollections
    import matplotlib.container as mcontainer
    import matplotlib.lines as mlines
    import matplotlib.patches as mpatches

    boxes = _recorded_boxes(ax)
    if boxes:
        return "box_and_whisker", boxes
    hists = _recorded_hists(ax)
    if hists:
        return "histogram", hists
    # Error bars, axhline/axvline and grid-like rules are decorations, not series; lines
    # without points are legend handles (seaborn's).
    lines = [
        line for line in ax.lines if isinstance(line, mlines.Line2D) and len(line.get_xdata(orig=False)) and not _is_rule(line)
    ]
    bars = [c for c in ax.containers if isinstance(c, mcontainer.BarContainer)]
    collections = list(ax.collections)
    patches = list(ax.patches)
    if ax.images:
        return "unknown", []
    if patches and not lines and not collections and all(isinstance(p, mpatches.Wedge) for p in patches):
        return "pie", [_wedge(p) for p in patches]
    if bars and not collections:
        in_bars = {id(p) for c in bars for p in c}
        # Beside the bars, only empty rectangles (seaborn's legend handles) may be there.
        if all(id(p) in in_bars or _is_empty_rectangle(p) for p in patches):
            kind, elements = _bars(ax, bars)
            # A histogram may carry a density line (seaborn's kde=True); bars may not.
            if kind == "histogram" or not lines:
                return kind, elements
    if collections and not lines and not patches:
        if all(type(c) is mcollections.PathCollection for c in collections):
            return "scatter", [e for i, c in enumerate(collections) for e in _scatter(ax, i, c)]
    # Bands (fill_between, seaborn's confidence intervals) and error bars go with their lines;
    # lines of one point each are markers of something else (a violin's median).
    decorations = all(isinstance(c, (mcollections.PolyCollection, mcollections.LineCollection)) for c in collections)
    series = any(len(line.get_xdata(orig=False)) > 1 for line in lines)
    if series and decorations and not patches and not bars:
        return "line", [_line(ax, i, line) for i, line in enumerate(lines)]
    return "unknown", []


def _is_empty_rectangle(patch):
    import matplotlib.patches as mpatches

    return isinstance(patch, mpatches.Rectangle) and patch.get_width() == 0 and patch.get_height() == 0


def _is_decoration(ax):
    """A colorbar's axes: part of another axes' picture, not a chart of its own."""
    return getattr(ax, "_colorbar", None) is not None


def _is_rule(line):
    """A two-point horizontal or vertical line: an axhline, a grid line, an error bar."""
    x, y = line.get_xdata(orig=False), line.get_ydata(orig=False)
    if len(x) != 2 or len(y) != 2:
        return False
    return x[0] == x[1] or y[0] == y[1]


def _label(artist, index, word):
    label = artist.get_label()
    if (not isinstance(label, str) or label.startswith("_")) and hasattr(artist, "patches"):
        # plt.hist labels the first bar, not the container
        label = artist.patches[0].get_label() if artist.patches else None
    if not isinstance(label, str) or not label or label.startswith("_"):
        return f"{word} {index + 1}"
    return label


def _line(ax, index, line):
    xs = _axis_values(ax.xaxis, line.get_xdata(orig=False)[:MAX_POINTS])
    ys = _axis_values(ax.yaxis, line.get_ydata(orig=False)[:MAX_POINTS])
    points = [[x, y] for x, y in zip(xs, ys)]
    label = _label(line, index, "Line")
    if _unlabelled(line):
        # plt.errorbar labels its container; seaborn's hue, a legend drawn apart.
        named = [c.get_label() for c in ax.containers if getattr(c, "lines", None) and c.lines[0] is line]
        if named and not named[0].startswith("_"):
            label = named[0]
        else:
            label = _legend_colours(ax).get(_rgba(line.get_color()), label)
    return {"label": label, "points": points}


def _scatter(ax, index, collection):
    """A point set; one coloured by a legend's entries (seaborn's hue) is one per entry."""
    offsets = collection.get_offsets()[: MAX_POINTS * 10]
    xs = _axis_values(ax.xaxis, [row[0] for row in offsets])
    ys = _axis_values(ax.yaxis, [row[1] for row in offsets])
    label = _label(collection, index, "Series")
    colours = _legend_colours(ax)
    faces = collection.get_facecolors()
    if _unlabelled(collection) and colours and len(faces) == len(offsets) > 1:
        groups = {}
        for x, y, face in zip(xs, ys, faces):
            name = colours.get(_rgba(face))
            if name is None:
                break
            groups.setdefault(name, []).append([x, y])
        else:
            return [{"label": name, "points": points[:MAX_POINTS]} for name, points in groups.items()]
    return [{"label": label, "points": [[x, y] for x, y in zip(xs, ys)][:MAX_POINTS]}]


def _unlabelled(artist):
    label = artist.get_label()
    return not isinstance(label, str) or not label or label.startswith("_")


def _rgba(colour):
    try:
        import matplotlib.colors as mcolors

        return tuple(round(c, 4) for c in mcolors.to_rgba(colour))
    except Exception:
        return None


def _legend_colours(ax):
    """{rgba: entry} of the axes' legend, for series drawn unlabelled with a legend made
    apart (seaborn's hue)."""
    try:
        legend = ax.get_legend()
        if legend is None:
            return {}
        out = {}
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            colour = None
            if hasattr(handle, "get_markerfacecolor") and handle.get_marker() not in (None, "None", ""):
                colour = handle.get_markerfacecolor()
            elif hasattr(handle, "get_color"):
                colour = handle.get_color()
            elif hasattr(handle, "get_facecolor"):
                colour = handle.get_facecolor()
                if hasattr(colour, "ndim") and colour.ndim == 2:
                    colour = colour[0] if len(colour) else None
            key = _rgba(colour) if colour is not None else None
            if key is not None and text.get_text():
                out.setdefault(key, text.get_text())
        return out
    except Exception:
        return {}


def _wedge(wedge):
    label = wedge.get_label()
    return {
        "label": label if isinstance(label, str) else str(label),
        "angle": _round(abs(float(wedge.theta2) - float(wedge.theta1))),
        "radius": _number(wedge.r),
    }


def _bars(ax, containers):
    """Bars, or a histogram when every container's bars touch (no gaps) on a numeric axis."""
    if all(_is_histogram(ax, c) for c in containers):
        elements = []
        for i, container in enumerate(containers):
            vertical = _vertical(container)
            rects = sorted(container, key=lambda r: r.get_x() if vertical else r.get_y())
            if vertical:
                edges = [r.get_x() for r in rects] + [rects[-1].get_x() + rects[-1].get_width()]
                counts = [r.get_height() for r in rects]
            else:
                edges = [r.get_y() for r in rects] + [rects[-1].get_y() + rects[-1].get_height()]
                counts = [r.get_width() for r in rects]
            elements.append(
                {
                    "label": _container_label(ax, container, i, "Series"),
                    "bin_edges": [_round(e) for e in edges],
                    "counts": [_number(c) for c in counts],
                }
            )
        return "histogram", elements
    elements = []
    legend = _legend_texts(ax)
    named = len(legend) == len(containers) and all(_label(c, 0, "Group") == "Group 1" for c in containers)
    for i, container in enumerate(containers):
        # Unnamed containers with a legend of as many entries (seaborn's hue): its names.
        group = _container_label(ax, container, i, "Group")
        if named and group == f"Group {i + 1}":
            group = legend[i]
        vertical = _vertical(container)
        axis = ax.xaxis if vertical else ax.yaxis
        locations, labels = _ticks(axis)
        for rect in container:
            if vertical:
                centre, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            else:
                centre, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            elements.append({"label": _bar_label(axis, centre, locations, labels), "group": group, "value": _number(value)})
    return "bar", elements


def _container_label(ax, container, index, word):
    """A container's label, else the legend entry of its bars' colour (seaborn's hue)."""
    label = _label(container, index, word)
    if label != f"{word} {index + 1}" or not container.patches:
        return label
    return _legend_colours(ax).get(_rgba(container.patches[0].get_facecolor()), label)


def _legend_texts(ax):
    try:
        legend = ax.get_legend()
        return [t.get_text() for t in legend.get_texts()] if legend is not None else []
    except Exception:
        return []


def _vertical(container):
    orientation = getattr(container, "orientation", None)
    if orientation in ("vertical", "horizontal"):
        return orientation == "vertical"
    widths = [r.get_width() for r in container]
    return all(w == widths[0] for w in widths)


def _is_histogram(ax, container):
    rects = list(container)
    if len(rects) < 2:
        return False
    vertical = _vertical(container)
    axis = ax.xaxis if vertical else ax.yaxis
    if _scale(axis, ax.get_xscale() if vertical else ax.get_yscale()) == "categorical":
        return False
    spans = sorted(
        (r.get_x(), r.get_x() + r.get_width()) if vertical else (r.get_y(), r.get_y() + r.get_height()) for r in rects
    )
    width = max(abs(end - start) for start, end in spans) or 1.0
    return all(abs(spans[i][1] - spans[i + 1][0]) <= 1e-9 * width for i in range(len(spans) - 1))


def _bar_label(axis, centre, locations, labels):
    """The category (tick label) under a bar, or its position when no tick sits there. On an
    axis of fixed ticks (categories, pandas' bar plots) a bar of a group sits beside its tick:
    the nearest tick within half the ticks' spacing names it."""
    for location, label in zip(locations, labels):
        if abs(location - centre) <= 1e-9 * max(1.0, abs(centre)) and label:
            return label
    import matplotlib.ticker as mticker

    fixed = isinstance(axis.get_major_locator(), mticker.FixedLocator)
    if locations and (fixed or type(_converter(axis)).__name__ == "StrCategoryConverter"):
        steps = [b - a for a, b in zip(locations, locations[1:]) if b > a]
        reach = min(steps) / 2 if steps else float("inf")
        nearest = min(range(len(locations)), key=lambda i: abs(locations[i] - centre))
        if abs(locations[nearest] - centre) < reach and labels[nearest]:
            return labels[nearest]
    value = _axis_values(axis, [centre])[0]
    return value if isinstance(value, str) else _format_number(value)


def _recorded_boxes(ax):
    """Boxes drawn by Axes.bxp (boxplot, pandas .plot.box, seaborn.boxplot), from the statistics
    it was given (see `install`): the picture's geometry cannot tell a box from a line."""
    boxes = []
    for stats, positions, vertical, medians in getattr(ax, "_runcell_boxes", ()):
        if not any(m.axes is ax for m in medians):
            continue  # cleared since
        axis = ax.xaxis if vertical else ax.yaxis
        locations, labels = _ticks(axis)
        for s, position in zip(stats, positions):
            label = s.get("label")
            if label is None:
                label = _bar_label(axis, position, locations, labels)
            boxes.append(
                {
                    "label": str(label),
                    "min": _number(s.get("whislo")),
                    "first_quartile": _number(s.get("q1")),
                    "median": _number(s.get("med")),
                    "third_quartile": _number(s.get("q3")),
                    "max": _number(s.get("whishi")),
                    "outliers": [_number(v) for v in list(s.get("fliers", ()))[:MAX_POINTS]],
                }
            )
    return boxes


def _recorded_hists(ax):
    """Histograms drawn by Axes.hist (plt.hist, pandas' .plot.hist and .hist), from the counts
    and edges it computed: several data sets side by side, stacked or as steps have no
    geometry of touching bars."""
    elements = []
    for counts, edges, artists, labels, stacked in getattr(ax, "_runcell_hists", ()):
        if not any(getattr(a, "axes", None) is ax for a in artists):
            continue  # cleared since
        rows = [list(counts)] if counts and not hasattr(counts[0], "__len__") else [list(c) for c in counts]
        if stacked:
            rows = [row if i == 0 else [b - a for a, b in zip(rows[i - 1], row)] for i, row in enumerate(rows)]
        for i, row in enumerate(rows):
            label = labels[i] if i < len(labels) and labels[i] else f"Series {len(elements) + 1}"
            elements.append(
                {"label": str(label), "bin_edges": [_round(e) for e in edges], "counts": [_number(c) for c in row]}
            )
    return elements


def _flatten(artists):
    out = []
    for a in artists if isinstance(artists, (list, tuple)) or hasattr(artists, "patches") else [artists]:
        if isinstance(a, (list, tuple)) or hasattr(a, "patches"):
            out.extend(_flatten(list(a)))
        else:
            out.append(a)
    return out


def install(axes_class):
    """Wrap Axes.bxp and Axes.hist to remember what they drew from (idempotent)."""
    _install_hist(axes_class)
    original = getattr(axes_class, "bxp", None)
    if original is None or getattr(original, "_runcell", False):
        return

    def bxp(self, bxpstats, positions=None, *args, **kwargs):
        artists = original(self, bxpstats, positions, *args, **kwargs)
        try:
            stats = [dict(s) for s in bxpstats]
            if positions is None:
                positions = range(1, len(stats) + 1)
            vertical = kwargs.get("orientation", "vertical") == "vertical" and kwargs.get("vert") is not False
            medians = list(artists.get("medians", ()) or artists.get("boxes", ()))
            recorded = self.__dict__.setdefault("_runcell_boxes", [])
            recorded.append((stats, [float(p) for p in positions], vertical, medians))
        except Exception:
            pass
        return artists

    bxp._runcell = True
    bxp.__wrapped__ = original
    bxp.__doc__ = original.__doc__
    axes_class.bxp = bxp


def _install_hist(axes_class):
    original = getattr(axes_class, "hist", None)
    if original is None or getattr(original, "_runcell", False):
        return

    def hist(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            counts, edges, patches = result
            rows = counts.tolist() if hasattr(counts, "tolist") else [list(c) for c in counts]
            label = kwargs.get("label")
            labels = [label] if isinstance(label, str) else list(label) if label is not None else []
            recorded = self.__dict__.setdefault("_runcell_hists", [])
            recorded.append((rows, list(edges), _flatten(patches), labels, bool(kwargs.get("stacked"))))
        except Exception:
            pass
        return result

    hist._runcell = True
    hist.__wrapped__ = original
    hist.__doc__ = original.__doc__
    axes_class.hist = hist


# ---- axes, ticks and values -----------------------------------------------------------------


def _axes_info(ax):
    x_label, y_label = _text(ax.get_xlabel()), _text(ax.get_ylabel())
    x_ticks, x_tick_labels = _ticks(ax.xaxis)
    y_ticks, y_tick_labels = _ticks(ax.yaxis)
    return {
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
        "x_ticks": _axis_values(ax.xaxis, x_ticks, categories=False),
        "x_tick_labels": x_tick_labels,
        "x_scale": _scale(ax.xaxis, ax.get_xscale()),
        "y_ticks": _axis_values(ax.yaxis, y_ticks, categories=False),
        "y_tick_labels": y_tick_labels,
        "y_scale": _scale(ax.yaxis, ax.get_yscale()),
    }


def _empty_axes_info():
    return dict.fromkeys(("x_label", "y_label", "x_unit", "y_unit"), None) | {
        "x_ticks": [],
        "x_tick_labels": [],
        "x_scale": "unknown",
        "y_ticks": [],
        "y_tick_labels": [],
        "y_scale": "unknown",
    }


def _ticks(axis):
    """The major ticks inside the view and their labels, as the formatter writes them (no
    draw needed)."""
    low, high = sorted(axis.get_view_interval())
    margin = (high - low) * 1e-9
    locations = [float(t) for t in axis.get_majorticklocs() if low - margin <= t <= high + margin]
    try:
        labels = list(axis.get_major_formatter().format_ticks(locations))
    except Exception:
        labels = [""] * len(locations)
    return locations, [str(label).replace("\u2212", "-") for label in labels]


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if get is not None else getattr(axis, "converter", None)


def _scale(axis, scale):
    converter = _converter(axis)
    name = type(converter).__name__ if converter is not None else ""
    if "Date" in name or name == "PeriodConverter":
        return "datetime"
    if name == "StrCategoryConverter":
        return "categorical"
    return scale if scale in ("linear", "log", "symlog", "logit", "function", "functionlog", "asinh") else "unknown"


def _axis_values(axis, values, categories=True):
    """Plotted values in the axis' own terms: dates as ISO 8601, categories as their names
    (ticks keep their positions, their labels name them), numbers as numbers (NaN and
    infinities, which JSON cannot hold, as null)."""
    converter = _converter(axis)
    name = type(converter).__name__ if converter is not None else ""
    if name == "StrCategoryConverter" and categories:
        names = {}
        try:
            names = {float(v): str(k) for k, v in axis.units._mapping.items()}
        except Exception:
            pass
        return [names.get(_number(v), _number(v)) for v in values]
    if name == "PeriodConverter":
        freq = getattr(axis.get_major_formatter(), "freq", None)
        pandas = sys.modules.get("pandas")
        if freq is not None and pandas is not None:
            return [_period(pandas, v, freq) for v in values]
    if "Date" in name:
        dates = sys.modules.get("matplotlib.dates")
        if dates is not None:
            return [_date(dates, v) for v in values]
    return [_number(v) for v in values] if categories else [_tick(v) for v in values]


def _tick(value):
    """12 significant digits: a tick at 0.6 is not 0.6000000000000001."""
    number = _number(value)
    if not isinstance(number, float):
        return number
    rounded = float(f"{number:.12g}")
    return int(rounded) if rounded.is_integer() else rounded


def _period(pandas, value, freq):
    try:
        return pandas.Period(ordinal=int(value), freq=freq).to_timestamp().isoformat()
    except Exception:
        return _number(value)


def _date(dates, value):
    try:
        return dates.num2date(float(value)).replace(tzinfo=None).isoformat()
    except Exception:
        return _number(value)


def _number(value):
    if value is None:
        return None
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(number):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _round(value):
    """8 significant digits: a pie's angles without float noise (36.00000000000001)."""
    number = _number(value)
    if not isinstance(number, float):
        return number
    rounded = float(f"{number:.8g}")
    return int(rounded) if rounded.is_integer() else rounded


def _format_number(value):
    return "" if value is None else str(value)


def _text(text):
    return text if isinstance(text, str) and text else None


def _unit(label):
    if not label:
        return None
    match = _UNIT.search(label)
    return (match.group(1) or match.group(2)) if match else None


def _suptitle(figure):
    suptitle = getattr(figure, "_suptitle", None)
    return _text(suptitle.get_text()) if suptitle is not None else None
