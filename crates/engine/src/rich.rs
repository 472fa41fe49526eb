//! Rich results as a model reads them: each MIME type a kernel can produce becomes an image
//! the model sees or text it can use, and a figure's chart data a short summary of what it
//! plots (the values, not only the pixels).

use std::fmt::Write as _;

use serde_json::Value;

use crate::model::ResultItem;

/// Values shown per chart element, and elements per chart, in a summary.
const SUMMARY_VALUES: usize = 6;
const SUMMARY_ELEMENTS: usize = 8;
/// Characters of a markup or JSON representation a model gets (SVG text, a Vega-Lite spec).
const SOURCE_CAP: usize = 4000;

/// What a model gets of one result: the image to attach (PNG or JPEG, base64), then labelled
/// text sections.
pub(crate) struct ModelView {
    pub image: Option<(&'static str, String)>,
    pub sections: Vec<(String, String)>,
}

/// The image a model is shown and the text it reads for `r`; `label` is `result` or `display`.
pub(crate) fn model_view(r: &ResultItem, label: &str) -> ModelView {
    let image = ["image/png", "image/jpeg"]
        .into_iter()
        .find_map(|mime| r.data.get(mime).map(|data| (mime, data.clone())));
    let mut sections = Vec::new();
    if let Some(chart) = &r.chart {
        sections.push(("chart".to_owned(), chart_summary(chart)));
    }
    if let Some((what, text)) = text_view(r) {
        let label = match what {
            Some(what) => format!("{label} ({what})"),
            None => label.to_owned(),
        };
        sections.push((label, text));
    }
    ModelView { image, sections }
}

/// The richest text a model can use, and what kind it is; None when only text/plain (or an
/// image, whose text/plain is a repr like `<Figure …>`) is there.
fn text_view(r: &ResultItem) -> Option<(Option<&'static str>, String)> {
    let d = &r.data;
    if let Some(md) = d.get("text/markdown") {
        return Some((Some("markdown"), md.clone()));
    }
    if let Some(tex) = d.get("text/latex") {
        return Some((Some("LaTeX"), tex.clone()));
    }
    if let Some((_, spec)) = d
        .iter()
        .find(|(m, _)| m.starts_with("application/vnd.vegalite.") && m.ends_with("+json"))
    {
        return Some((Some("Vega-Lite chart"), vega_summary(spec)));
    }
    if let Some(fig) = d.get("application/vnd.plotly.v1+json") {
        return Some((Some("Plotly chart"), plotly_summary(fig)));
    }
    if let Some(json) = d.get("application/json") {
        let pretty = serde_json::from_str::<Value>(json)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| json.clone());
        return Some((Some("JSON"), cap(&pretty)));
    }
    if let Some(svg) = d.get("image/svg+xml") {
        return Some((
            Some("SVG image"),
            format!("{} bytes of SVG:\n{}", svg.len(), cap(svg)),
        ));
    }
    if let Some(pdf) = d.get("application/pdf") {
        let bytes = pdf.len() / 4 * 3;
        return Some((
            Some("PDF document"),
            format!("a PDF of about {bytes} bytes (in the result's application/pdf, base64)"),
        ));
    }
    let has_image = d.contains_key("image/png") || d.contains_key("image/jpeg");
    d.get("text/plain")
        .filter(|_| !has_image)
        .map(|plain| (None, plain.clone()))
}

fn cap(text: &str) -> String {
    truncate_section(text, SOURCE_CAP)
}

/// `text` cut to about `cap` characters: its head and tail around an explicit
/// `[… N bytes truncated …]` line (the marker the engine uses for capped output).
pub fn truncate_section(text: &str, cap: usize) -> String {
    if text.chars().count() <= cap {
        return text.to_owned();
    }
    let half = cap / 2;
    let head_end = text.char_indices().nth(half).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .rev()
        .nth(half.saturating_sub(1))
        .map_or(head_end, |(i, _)| i.max(head_end));
    format!(
        "{}\n[… {} bytes truncated …]\n{}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

/// `line chart "Title" (x: time (s), y: speed): 2 series: …`, one line per chart of a
/// superchart.
pub fn chart_summary(chart: &Value) -> String {
    let kind = str_of(chart, "type").unwrap_or("unknown");
    let mut s = String::new();
    if kind == "superchart" {
        let charts = chart["elements"].as_array().map_or(&[][..], Vec::as_slice);
        let _ = write!(s, "{} subplots", charts.len());
        if let Some(t) = str_of(chart, "title") {
            let _ = write!(s, " titled {t:?}");
        }
        for (i, c) in charts.iter().enumerate().take(SUMMARY_ELEMENTS) {
            let _ = write!(s, "\n{}. {}", i + 1, chart_summary(c));
        }
        more(&mut s, charts.len(), SUMMARY_ELEMENTS, "subplots");
        return s;
    }
    let _ = write!(s, "{} chart", kind.replace('_', "-"));
    if let Some(t) = str_of(chart, "title") {
        let _ = write!(s, " {t:?}");
    }
    let axes: Vec<String> = [("x", "x_label"), ("y", "y_label")]
        .into_iter()
        .filter_map(|(axis, key)| str_of(chart, key).map(|l| format!("{axis}: {l}")))
        .collect();
    if !axes.is_empty() {
        let _ = write!(s, " ({})", axes.join(", "));
    }
    let elements = chart["elements"].as_array().map_or(&[][..], Vec::as_slice);
    if elements.is_empty() {
        s.push_str(": no data extracted");
        return s;
    }
    let parts: Vec<String> = match kind {
        "line" | "scatter" => elements
            .iter()
            .take(SUMMARY_ELEMENTS)
            .map(|e| {
                let points = e["points"].as_array().map_or(&[][..], Vec::as_slice);
                let shown: Vec<String> = points
                    .iter()
                    .take(SUMMARY_VALUES)
                    .map(|p| format!("({}, {})", value(&p[0]), value(&p[1])))
                    .collect();
                let mut t = format!(
                    "{} ({} points): {}",
                    str_of(e, "label").unwrap_or("?"),
                    points.len(),
                    shown.join(" ")
                );
                more(&mut t, points.len(), SUMMARY_VALUES, "points");
                t
            })
            .collect(),
        "bar" => elements
            .iter()
            .take(SUMMARY_VALUES * 2)
            .map(|e| {
                let group = str_of(e, "group").map_or(String::new(), |g| format!("[{g}] "));
                format!(
                    "{group}{}={}",
                    str_of(e, "label").unwrap_or("?"),
                    value(&e["value"])
                )
            })
            .collect(),
        "histogram" => elements
            .iter()
            .take(SUMMARY_ELEMENTS)
            .map(|e| {
                let edges = e["bin_edges"].as_array().map_or(&[][..], Vec::as_slice);
                let counts = e["counts"].as_array().map_or(&[][..], Vec::as_slice);
                let bins: Vec<String> = counts
                    .iter()
                    .zip(edges.windows(2))
                    .take(SUMMARY_VALUES)
                    .map(|(c, w)| format!("[{}, {}): {}", value(&w[0]), value(&w[1]), value(c)))
                    .collect();
                let mut t = format!(
                    "{} ({} bins): {}",
                    str_of(e, "label").unwrap_or("?"),
                    counts.len(),
                    bins.join(" ")
                );
                more(&mut t, counts.len(), SUMMARY_VALUES, "bins");
                t
            })
            .collect(),
        "pie" => elements
            .iter()
            .take(SUMMARY_VALUES * 2)
            .map(|e| {
                let share = e["angle"].as_f64().unwrap_or(0.0) / 360.0 * 100.0;
                format!("{} {share:.1}%", str_of(e, "label").unwrap_or("?"))
            })
            .collect(),
        "box_and_whisker" => elements
            .iter()
            .take(SUMMARY_ELEMENTS)
            .map(|e| {
                format!(
                    "{}: min {} q1 {} median {} q3 {} max {} ({} outliers)",
                    str_of(e, "label").unwrap_or("?"),
                    value(&e["min"]),
                    value(&e["first_quartile"]),
                    value(&e["median"]),
                    value(&e["third_quartile"]),
                    value(&e["max"]),
                    e["outliers"].as_array().map_or(0, Vec::len)
                )
            })
            .collect(),
        _ => vec![format!("{} elements", elements.len())],
    };
    let shown = parts.len();
    let _ = write!(s, ": {}", parts.join("; "));
    more(&mut s, elements.len(), shown, "more");
    s
}

fn more(s: &mut String, total: usize, shown: usize, what: &str) {
    if total > shown {
        let _ = write!(s, " … ({} {what} not shown)", total - shown);
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".to_owned(),
        other => other.to_string(),
    }
}

/// A Vega-Lite spec: its mark, title and how many data values it holds, then the spec.
fn vega_summary(spec: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(spec) else {
        return cap(spec);
    };
    let mark = match &v["mark"] {
        Value::String(m) => Some(m.clone()),
        Value::Object(o) => o.get("type").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let mut s = String::new();
    if let Some(m) = mark {
        let _ = write!(s, "mark {m}; ");
    }
    if let Some(t) = v.get("title").and_then(Value::as_str) {
        let _ = write!(s, "title {t:?}; ");
    }
    if let Some(values) = v["data"]["values"].as_array() {
        let _ = write!(s, "{} data values; ", values.len());
    }
    let _ = write!(s, "spec:\n{}", cap(spec));
    s
}

/// A Plotly figure: its traces (type, name, points), then the figure.
fn plotly_summary(fig: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(fig) else {
        return cap(fig);
    };
    let traces = v["data"].as_array().map_or(&[][..], Vec::as_slice);
    let mut s = format!("{} trace(s)", traces.len());
    if let Some(t) = v["layout"]["title"]["text"]
        .as_str()
        .or(v["layout"]["title"].as_str())
    {
        let _ = write!(s, ", title {t:?}");
    }
    for t in traces.iter().take(SUMMARY_ELEMENTS) {
        let kind = t["type"].as_str().unwrap_or("scatter");
        let n = t["y"]
            .as_array()
            .or(t["values"].as_array())
            .map_or(0, Vec::len);
        let _ = write!(s, "; {kind}");
        if let Some(name) = t["name"].as_str() {
            let _ = write!(s, " {name:?}");
        }
        let _ = write!(s, " ({n} points)");
    }
    let _ = write!(s, "\nfigure:\n{}", cap(fig));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn item(pairs: &[(&str, &str)], chart: Option<Value>) -> ResultItem {
        ResultItem {
            is_main_result: false,
            data: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            chart,
        }
    }

    #[test]
    fn charts_are_summarised_with_their_values() {
        let line = json!({"type":"line","title":"T","x_label":"time (s)","y_label":null,
            "elements":[{"label":"speed","points":[[1,4.5],[2,5],[3,-6]]}]});
        assert_eq!(
            chart_summary(&line),
            "line chart \"T\" (x: time (s)): speed (3 points): (1, 4.5) (2, 5) (3, -6)"
        );
        let bars = json!({"type":"bar","elements":[{"label":"a","group":"g","value":1},
            {"label":"b","group":"g","value":2.5}]});
        assert_eq!(chart_summary(&bars), "bar chart: [g] a=1; [g] b=2.5");
        let hist = json!({"type":"histogram","elements":[{"label":"h","bin_edges":[0,1,2],"counts":[3,4]}]});
        assert_eq!(
            chart_summary(&hist),
            "histogram chart: h (2 bins): [0, 1): 3 [1, 2): 4"
        );
        let pie =
            json!({"type":"pie","title":null,"elements":[{"label":"a","angle":90,"radius":1}]});
        assert_eq!(chart_summary(&pie), "pie chart: a 25.0%");
        let boxes = json!({"type":"box_and_whisker","elements":[{"label":"p","min":1,"first_quartile":2,
            "median":3,"third_quartile":4,"max":5,"outliers":[50]}]});
        assert_eq!(
            chart_summary(&boxes),
            "box-and-whisker chart: p: min 1 q1 2 median 3 q3 4 max 5 (1 outliers)"
        );
        let sup = json!({"type":"superchart","title":"S","elements":[pie, {"type":"unknown","elements":[]}]});
        assert_eq!(
            chart_summary(&sup),
            "2 subplots titled \"S\"\n1. pie chart: a 25.0%\n2. unknown chart: no data extracted"
        );
        let many: Vec<Value> = (0..20).map(|i| json!([i, i])).collect();
        let long = json!({"type":"scatter","elements":[{"label":"s","points":many}]});
        assert!(chart_summary(&long).ends_with("(5, 5) … (14 points not shown)"));
    }

    #[test]
    fn each_mime_type_becomes_something_a_model_reads() {
        let figure = item(
            &[("image/png", "iVBO"), ("text/plain", "<Figure>")],
            Some(json!({"type":"pie","elements":[]})),
        );
        let v = model_view(&figure, "display");
        assert_eq!(v.image, Some(("image/png", "iVBO".to_owned())));
        assert_eq!(
            v.sections,
            [(
                "chart".to_owned(),
                "pie chart: no data extracted".to_owned()
            )]
        );
        let jpeg = model_view(&item(&[("image/jpeg", "/9j/")], None), "display");
        assert_eq!(jpeg.image, Some(("image/jpeg", "/9j/".to_owned())));
        assert!(jpeg.sections.is_empty());
        let cases = [
            ("text/markdown", "# Hi", "display (markdown)", "# Hi"),
            ("text/latex", "$x^2$", "display (LaTeX)", "$x^2$"),
            ("application/json", r#"{"a":1}"#, "display (JSON)", "{\n  \"a\": 1\n}"),
            (
                "image/svg+xml",
                "<svg/>",
                "display (SVG image)",
                "6 bytes of SVG:\n<svg/>",
            ),
            (
                "application/pdf",
                "JVBERi0x",
                "display (PDF document)",
                "a PDF of about 6 bytes (in the result's application/pdf, base64)",
            ),
            (
                "application/vnd.vegalite.v5+json",
                r#"{"mark":"bar","data":{"values":[{"a":1}]}}"#,
                "display (Vega-Lite chart)",
                "mark bar; 1 data values; spec:\n{\"mark\":\"bar\",\"data\":{\"values\":[{\"a\":1}]}}",
            ),
            (
                "application/vnd.plotly.v1+json",
                r#"{"data":[{"type":"bar","y":[1,2]}]}"#,
                "display (Plotly chart)",
                "1 trace(s); bar (2 points)\nfigure:\n{\"data\":[{\"type\":\"bar\",\"y\":[1,2]}]}",
            ),
        ];
        for (mime, data, label, text) in cases {
            let v = model_view(
                &item(&[(mime, data), ("text/plain", "<obj>")], None),
                "display",
            );
            assert_eq!(v.image, None, "{mime}");
            assert_eq!(v.sections, [(label.to_owned(), text.to_owned())], "{mime}");
        }
        let plain = model_view(&item(&[("text/plain", "42")], None), "result");
        assert_eq!(plain.sections, [("result".to_owned(), "42".to_owned())]);
    }
}
