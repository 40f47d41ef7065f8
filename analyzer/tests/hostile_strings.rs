//! Strings a trace carries reaching other formats: a trace is a file another user may hand
//! over, and every string in it (host, command line, device name, configuration, module
//! paths, Python files and functions, a failed entry point's name) is written with a payload
//! for each output format: markup and script for the HTML report, a quote and brace for the
//! JSON outputs, control characters for the text. Each output keeps the payload as text.

mod common;
use common::*;

use std::path::Path;

use vramshim_trace::event::torch_action as act;
use vramshim_trace::{Api, DeviceInfo, Event, Header, MemOp, PyFrame, TorchOp, TraceWriter, codes};

/// Markup that runs script where it is not escaped: as an element, as an attribute broken out
/// of (both quotes), as a closed `title`/`style`/`textarea` raw-text element, as a comment.
const MARKUP: &str =
    "<script>alert(1)</script>\"'><img src=x onerror=alert(2)></title></style></textarea><!--";
/// A JSON string broken out of, and a new key added.
const JSON: &str = "\",\"injected\":true,\"x\":\"";

fn payload(what: &str) -> String {
    format!("{what}{MARKUP}{JSON}\u{1b}[2J\u{202e}")
}

fn op(t: u64, api: Api, addr: u64, size: u64, result: i32, stack: u32) -> MemOp {
    MemOp {
        stack,
        ..memop(t, api, addr, size, result)
    }
}

fn torch(t: u64, action: u8, addr: u64, size: u64, segment: u64, stack: u32) -> Event {
    Event::Torch(TorchOp {
        t_ns: t,
        tid: 1,
        action,
        device: 0,
        addr,
        size,
        stream: 0,
        segment,
        stack,
    })
}

/// The hostile trace: every string field holds [`payload`]; an allocation at a native stack
/// and one at a Python stack, PyTorch's tensors in a segment, a failed start-up call, and a
/// refused allocation (a post-mortem, with PyTorch's view at the failure).
fn write(path: &Path) {
    let header = Header {
        pid: 7,
        host: payload("host"),
        cmdline: vec!["python".into(), payload("arg")],
        devices: vec![DeviceInfo {
            index: 0,
            name: payload("device"),
            total_bytes: 1 << 30,
            uuid: None,
        }],
        config: vec![
            ("VRAMSHIM_CAP".into(), payload("cap")),
            (payload("VRAMSHIM_KEY"), payload("value")),
        ],
        ..Default::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    let records = vec![
        Event::Device(DeviceInfo {
            index: 0,
            name: payload("device-record"),
            total_bytes: 1 << 30,
            uuid: Some([0x11; 16]),
        }),
        Event::Module {
            base: 0x1000_0000,
            size: 0x1000,
            file_offset: 0,
            path: format!("/lib/{}.so", payload("module")),
        },
        Event::PyCode {
            id: 3,
            file: format!("/home/u/{}.py", payload("pyfile")),
            function: payload("pyfunc"),
            first_line: 10,
        },
        Event::PyStack {
            id: 5,
            frames: vec![PyFrame { code: 3, line: 12 }],
        },
        Event::Stack {
            id: 1,
            frames: vec![0x1000_0010],
        },
        Event::Stack {
            id: 2,
            frames: vec![1 << 63 | 3 << 32 | 12, 0x1000_0010],
        },
        Event::CallFailed {
            t_ns: 500,
            tid: 1,
            device: 0,
            name: payload("cuInit"),
            result: 999,
        },
        Event::Alloc(op(1_000, Api::CudaMalloc, 0x7000_0000, 1 << 20, 0, 1)),
        Event::Alloc(op(1_500, Api::CudaMalloc, 0x7100_0000, 4 << 20, 0, 2)),
        torch(
            1_600,
            act::SEGMENT_ALLOC,
            0x7100_0000,
            4 << 20,
            0x7100_0000,
            5,
        ),
        torch(1_700, act::ALLOC, 0x7100_0000, 1 << 20, 0x7100_0000, 5),
        Event::Alloc(op(
            2_000,
            Api::CudaMalloc,
            0,
            1 << 31,
            codes::OUT_OF_MEMORY,
            2,
        )),
        torch(2_100, act::OOM, 1 << 20, 1 << 31, 0, 5),
        Event::Free(op(3_000, Api::CudaFree, 0x7000_0000, 1 << 20, 0, 0)),
    ];
    for e in &records {
        w.write(e).unwrap();
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

/// Every `<` of the page opens a tag the report itself writes, and none of them is a script,
/// an image or an event handler; the payload's markup shows as text (escaped).
fn html_clean(what: &str, html: &str) {
    const TAGS: &[&str] = &[
        "!DOCTYPE", "!doctype", "html", "head", "meta", "title", "style", "body", "header", "h1",
        "h2", "h3", "h4", "p", "main", "section", "table", "tr", "th", "td", "div", "b", "span",
        "code", "pre", "svg", "rect", "line", "text", "path", "g", "i", "footer", "ul", "li", "br",
        "small", "a",
    ];
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        let tag = rest[i + 1..].trim_start_matches('/');
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '!')
            .collect();
        assert!(
            TAGS.contains(&name.as_str()),
            "{what}: a tag the report does not write: <{}",
            &tag[..tag.len().min(60)]
        );
        rest = &rest[i + 1..];
    }
    for raw in ["<script", "<img", "<!--", "</textarea"] {
        assert!(
            !html.to_ascii_lowercase().contains(raw),
            "{what}: {raw} unescaped"
        );
    }
    // nor do the characters a terminal escapes: shown as their escape, as on a terminal
    for c in ['\u{1b}', '\u{202e}'] {
        assert!(!html.contains(c), "{what}: {c:?} reached the page");
    }
    assert!(
        html.contains("\\u{1b}[2J\\u{202e}"),
        "{what}: not shown escaped"
    );
    // the strings are there, as text
    for s in ["host", "arg", "device-record", "value", "pyfunc", "cuInit"] {
        assert!(
            html.contains(&format!(
                "{s}&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&gt;"
            )),
            "{what}: {s}'s payload not shown escaped"
        );
    }
}

#[test]
fn trace_strings_stay_text_in_the_html_report() {
    let d = scratch("hostile-strings-html");
    write(&d.join("a.vramtrace"));
    write(&d.join("b.vramtrace"));
    ok(&d, &["report", "a.vramtrace", "-o", "one.html"]);
    html_clean(
        "report",
        &std::fs::read_to_string(d.join("one.html")).unwrap(),
    );
    // two traces: the comparison's text and the by-GPU view (the same UUID on both)
    ok(
        &d,
        &["report", "a.vramtrace", "b.vramtrace", "-o", "two.html"],
    );
    html_clean(
        "report of two",
        &std::fs::read_to_string(d.join("two.html")).unwrap(),
    );
}

/// The JSON outputs parse, hold no key the payload tried to add, and give the strings back.
#[test]
fn trace_strings_stay_strings_in_the_json_outputs() {
    let d = scratch("hostile-strings-json");
    write(&d.join("a.vramtrace"));
    write(&d.join("b.vramtrace"));
    for args in [
        vec!["summary", "--json", "a.vramtrace"],
        vec!["diff", "--json", "a.vramtrace", "b.vramtrace"],
        vec!["replay", "--json", "a.vramtrace"],
        vec![
            "export",
            "a.vramtrace",
            "--format",
            "chrome-json",
            "-o",
            "a.json",
        ],
    ] {
        let out = ok(&d, &args);
        let text = if args[0] == "export" {
            std::fs::read_to_string(d.join("a.json")).unwrap()
        } else {
            String::from_utf8(out.stdout).unwrap()
        };
        assert!(!text.contains('\u{1b}'), "vramshim {args:?}: raw ESC");
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("vramshim {args:?}: not JSON ({e}):\n{text}"));
        fn no_injected_key(v: &serde_json::Value) -> bool {
            match v {
                serde_json::Value::Object(m) => {
                    !m.contains_key("injected") && m.values().all(no_injected_key)
                }
                serde_json::Value::Array(a) => a.iter().all(no_injected_key),
                _ => true,
            }
        }
        assert!(no_injected_key(&v), "vramshim {args:?}: a key was injected");
        if matches!(args[0], "summary" | "export") {
            assert!(
                v.to_string()
                    .contains(&serde_json::to_string(&payload("arg")).unwrap()[1..20]),
                "vramshim {args:?}: the command line is missing:\n{text}"
            );
        }
    }
}
