//! Chrome's Trace Event Format (JSON), which chrome://tracing and the Perfetto UI open:
//! a counter per device (`C`, keys `in_use`, `reserved`, `cap`), a complete slice (`X`) per
//! call on its thread, instants (`i`) for refusals and OOMs.

use std::io::{self, Write};

use vramshim_trace::{Event, Header, codes};

use super::InUse;
use crate::fastmap::FastMap;

pub struct ChromeWriter<W: Write> {
    w: W,
    pid: u32,
    t0: Option<u64>,
    first: bool,
    in_use: InUse,
    threads: FastMap<u32, ()>,
    pub events: u64,
}

fn esc(s: &str) -> String {
    crate::json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

impl<W: Write> ChromeWriter<W> {
    pub fn new(mut w: W, h: &Header) -> io::Result<Self> {
        let name = if h.cmdline.is_empty() {
            format!("pid {}", h.pid)
        } else {
            h.cmdline.join(" ")
        };
        write!(
            w,
            "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
            h.pid,
            esc(&name)
        )?;
        Ok(ChromeWriter {
            w,
            pid: h.pid,
            t0: None,
            first: false,
            in_use: InUse::default(),
            threads: FastMap::default(),
            events: 0,
        })
    }

    fn ts(&mut self, t: u64) -> f64 {
        let t0 = *self.t0.get_or_insert(t);
        (t as f64 - t0 as f64) / 1000.0
    }

    fn sep(&mut self) -> io::Result<()> {
        self.first = false;
        self.events += 1;
        self.w.write_all(b",\n")
    }

    fn thread_name(&mut self, tid: u32) -> io::Result<()> {
        if self.threads.insert(tid, ()).is_none() {
            self.sep()?;
            write!(
                self.w,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":\"tid {tid}\"}}}}",
                self.pid
            )?;
        }
        Ok(())
    }

    pub fn event(&mut self, ev: &Event) -> io::Result<()> {
        match ev {
            Event::Alloc(m) | Event::Free(m) => {
                let is_alloc = matches!(ev, Event::Alloc(_));
                let ts = self.ts(m.t_ns);
                self.thread_name(m.tid)?;
                self.sep()?;
                let dur = m.latency_ns as f64 / 1000.0;
                write!(
                    self.w,
                    "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":{dur:.3},\"pid\":{},\"tid\":{},\"args\":{{\"addr\":\"0x{:x}\",\"size\":{},\"device\":{},\"stream\":\"0x{:x}\",\"kind\":\"{}\",\"result\":{},\"stack\":{}}}}}",
                    m.api.name(),
                    if is_alloc { "alloc" } else { "free" },
                    self.pid,
                    m.tid,
                    m.addr,
                    m.size,
                    m.device,
                    m.stream,
                    m.kind.name(),
                    m.result,
                    m.stack
                )?;
                if m.result != codes::CUDA_SUCCESS || !m.kind.is_device() {
                    if is_alloc && m.result == codes::OUT_OF_MEMORY {
                        self.sep()?;
                        write!(
                            self.w,
                            "{{\"name\":\"out of memory\",\"ph\":\"i\",\"s\":\"p\",\"ts\":{ts:.3},\"pid\":{},\"tid\":{},\"args\":{{\"size\":{},\"device\":{}}}}}",
                            self.pid, m.tid, m.size, m.device
                        )?;
                    }
                    return Ok(());
                }
                let Some(v) = self.in_use.apply(m, is_alloc) else {
                    return Ok(());
                };
                self.sep()?;
                write!(
                    self.w,
                    "{{\"name\":\"dev{} memory\",\"ph\":\"C\",\"ts\":{ts:.3},\"pid\":{},\"args\":{{\"in_use\":{v}}}}}",
                    m.device, self.pid
                )?;
            }
            Event::Counter {
                t_ns,
                device,
                reserved_bytes,
                cap,
                ..
            } => {
                let ts = self.ts(*t_ns);
                self.sep()?;
                write!(
                    self.w,
                    "{{\"name\":\"dev{device} memory\",\"ph\":\"C\",\"ts\":{ts:.3},\"pid\":{},\"args\":{{\"reserved\":{reserved_bytes}",
                    self.pid
                )?;
                if *cap > 0 {
                    write!(self.w, ",\"cap\":{cap}")?;
                }
                self.w.write_all(b"}}")?;
            }
            Event::CapRefusal {
                t_ns,
                tid,
                device,
                api,
                size,
                in_use,
                cap,
            } => {
                let ts = self.ts(*t_ns);
                self.sep()?;
                write!(
                    self.w,
                    "{{\"name\":\"cap refusal\",\"ph\":\"i\",\"s\":\"p\",\"ts\":{ts:.3},\"pid\":{},\"tid\":{tid},\"args\":{{\"api\":\"{}\",\"size\":{size},\"in_use\":{in_use},\"cap\":{cap},\"device\":{device}}}}}",
                    self.pid,
                    api.name()
                )?;
            }
            Event::Sync {
                t_ns,
                tid,
                latency_ns,
                ..
            } => {
                let ts = self.ts(*t_ns);
                self.thread_name(*tid)?;
                self.sep()?;
                write!(
                    self.w,
                    "{{\"name\":\"sync\",\"cat\":\"sync\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":{:.3},\"pid\":{},\"tid\":{tid}}}",
                    *latency_ns as f64 / 1000.0,
                    self.pid
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<W> {
        let _ = self.first;
        self.w.write_all(b"\n]}\n")?;
        self.w.flush()?;
        Ok(self.w)
    }
}
