//! The Prometheus text exposition format (version 0.0.4), built from values:
//! families of counters, gauges and histograms, rendered in one pass.
//!
//! Pure: no IO, no clock. The daemon fills an [`Exposition`] from what it
//! knows and hands the text to the listener and the textfile writer
//! (`daemon::exporter`). The rules kept here, so no caller has to:
//!
//! - a metric or label name is `[a-zA-Z_:][a-zA-Z0-9_:]*` (label names
//!   without `:`); a bad name is a programming error and panics in debug
//!   builds, and is never rendered;
//! - label values escape `\`, `"` and newlines; HELP text escapes `\` and
//!   newlines;
//! - one `# HELP` and one `# TYPE` line per family, its samples together,
//!   families in the order they were added;
//! - a histogram's buckets are cumulative, end with `le="+Inf"` equal to
//!   `_count`, and come with `_sum`;
//! - values print as integers when they are, `NaN`, `+Inf` and `-Inf`
//!   otherwise as Go's `strconv` would read them.

use std::fmt::Write as _;

/// The content type of what [`Exposition::render`] returns.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a family's samples mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label pairs of one sample, in the order given.
pub type Labels = Vec<(&'static str, String)>;

/// Observations sorted into buckets by upper bound (seconds, bytes, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; one more than `bounds` (the `+Inf` one).
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending, finite).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        if value.is_finite() {
            self.sum += value;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }
}

enum Value {
    Plain(f64),
    Histogram(Histogram),
}

struct Sample {
    labels: Labels,
    value: Value,
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

/// Families of samples, rendered in the order they were added.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Start a family (or continue the last one of that name). Samples are
    /// added with [`Exposition::sample`] / [`Exposition::histogram`].
    fn family(&mut self, name: &'static str, help: &'static str, kind: Kind) -> &mut Family {
        debug_assert!(valid_metric_name(name), "metric name {name:?}");
        let found = self.families.iter().position(|f| f.name == name);
        let i = match found {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name,
                    help,
                    kind,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        debug_assert_eq!(self.families[i].kind, kind, "{name} changed kind");
        &mut self.families[i]
    }

    /// Declare a family with no samples yet: its HELP and TYPE are shown,
    /// so a scrape documents it before the first event.
    pub fn declare(&mut self, name: &'static str, help: &'static str, kind: Kind) {
        self.family(name, help, kind);
    }

    /// One counter or gauge sample.
    pub fn sample(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: Labels,
        value: f64,
    ) {
        debug_assert!(kind != Kind::Histogram, "{name}: use histogram()");
        debug_assert!(labels.iter().all(|(l, _)| valid_label_name(l)), "{name}");
        self.family(name, help, kind).samples.push(Sample {
            labels,
            value: Value::Plain(value),
        });
    }

    pub fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        self.sample(name, help, Kind::Counter, labels, value);
    }

    pub fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        self.sample(name, help, Kind::Gauge, labels, value);
    }

    /// One histogram sample (its buckets, `_sum` and `_count`).
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: Labels,
        histogram: Histogram,
    ) {
        debug_assert!(
            labels
                .iter()
                .all(|(l, _)| valid_label_name(l) && *l != "le")
        );
        self.family(name, help, Kind::Histogram)
            .samples
            .push(Sample {
                labels,
                value: Value::Histogram(histogram),
            });
    }

    /// The text a scrape gets.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(256 * self.families.len());
        for f in &self.families {
            if !valid_metric_name(f.name) {
                continue;
            }
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            for s in &f.samples {
                if !s.labels.iter().all(|(l, _)| valid_label_name(l)) {
                    continue;
                }
                match &s.value {
                    Value::Plain(v) => line(&mut out, f.name, "", &s.labels, None, *v),
                    Value::Histogram(h) => {
                        let mut cumulative = 0u64;
                        for (i, count) in h.counts.iter().enumerate() {
                            cumulative += count;
                            let le = h.bounds.get(i).map_or("+Inf".to_string(), |b| number(*b));
                            line(
                                &mut out,
                                f.name,
                                "_bucket",
                                &s.labels,
                                Some(&le),
                                cumulative as f64,
                            );
                        }
                        line(&mut out, f.name, "_sum", &s.labels, None, h.sum);
                        line(
                            &mut out,
                            f.name,
                            "_count",
                            &s.labels,
                            None,
                            h.count() as f64,
                        );
                    }
                }
            }
        }
        out
    }
}

fn line(out: &mut String, name: &str, suffix: &str, labels: &Labels, le: Option<&str>, v: f64) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (k, val) in labels {
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(out, "{k}=\"{}\"", escape_label(val));
        }
        if let Some(le) = le {
            if !first {
                out.push(',');
            }
            let _ = write!(out, "le=\"{le}\"");
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&number(v));
    out.push('\n');
}

/// A value as the exposition format writes it.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.abs() >= 1e15 || v.abs() < 1e-6 {
        // Rust's `{}` never uses an exponent: 1e300 would be 301 digits.
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_render_with_help_type_and_escaped_labels() {
        let mut e = Exposition::new();
        e.counter(
            "agent_state_sessions_total",
            "Sessions ended, by agent and outcome.",
            vec![("agent", "rio".into()), ("outcome", "completed".into())],
            3.0,
        );
        e.counter(
            "agent_state_sessions_total",
            "Sessions ended, by agent and outcome.",
            vec![("agent", "a\"b\\c\nd".into()), ("outcome", "error".into())],
            1.0,
        );
        e.gauge(
            "agent_state_up",
            "1 while the daemon runs.\nSecond line",
            vec![],
            1.0,
        );
        e.declare("agent_state_empty_total", "Nothing yet.", Kind::Counter);
        assert_eq!(
            e.render(),
            "# HELP agent_state_sessions_total Sessions ended, by agent and outcome.\n\
             # TYPE agent_state_sessions_total counter\n\
             agent_state_sessions_total{agent=\"rio\",outcome=\"completed\"} 3\n\
             agent_state_sessions_total{agent=\"a\\\"b\\\\c\\nd\",outcome=\"error\"} 1\n\
             # HELP agent_state_up 1 while the daemon runs.\\nSecond line\n\
             # TYPE agent_state_up gauge\n\
             agent_state_up 1\n\
             # HELP agent_state_empty_total Nothing yet.\n\
             # TYPE agent_state_empty_total counter\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_inf_sum_and_count() {
        let mut h = Histogram::new(&[1.0, 10.0, 60.0]);
        for v in [0.5, 5.0, 7.0, 100.0] {
            h.observe(v);
        }
        let mut e = Exposition::new();
        e.histogram(
            "agent_state_session_duration_seconds",
            "Session run time.",
            vec![("agent", "rio".into())],
            h,
        );
        let text = e.render();
        let want = "agent_state_session_duration_seconds_bucket{agent=\"rio\",le=\"1\"} 1\n\
                    agent_state_session_duration_seconds_bucket{agent=\"rio\",le=\"10\"} 3\n\
                    agent_state_session_duration_seconds_bucket{agent=\"rio\",le=\"60\"} 3\n\
                    agent_state_session_duration_seconds_bucket{agent=\"rio\",le=\"+Inf\"} 4\n\
                    agent_state_session_duration_seconds_sum 112.5\n";
        assert!(
            text.contains(&want.replace(
                "agent_state_session_duration_seconds_sum 112.5",
                "agent_state_session_duration_seconds_sum{agent=\"rio\"} 112.5"
            )),
            "{text}"
        );
        assert!(text.contains("agent_state_session_duration_seconds_count{agent=\"rio\"} 4\n"));
    }

    #[test]
    fn numbers_print_as_prometheus_reads_them() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(-2.0), "-2");
        assert_eq!(number(1.7e300), "1.7e300");
        assert_eq!(number(2.5e-9), "2.5e-9");
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_metric_name("agent_state_x:y_total"));
        assert!(!valid_metric_name("9lives"));
        assert!(!valid_metric_name("a-b"));
        assert!(valid_label_name("agent"));
        assert!(!valid_label_name("__reserved"));
        assert!(!valid_label_name("a:b"));
    }
}
