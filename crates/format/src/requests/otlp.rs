//! A request's spans ([`Span`]) as OpenTelemetry's wire formats: OTLP/JSON (what `stepscope
//! export` posts or writes) and OTLP protobuf (what the engine plugins hand the engine's own span
//! exporter, so that nothing is encoded again in Python), each an `ExportTraceServiceRequest`
//! of one resource (`service.name`) and one scope (`stepscope`).

use serde::Serialize;

use super::spans::{AttrValue, Span};

/// OTLP's JSON encoding of an attribute's value: 64-bit integers as strings.
#[derive(Serialize)]
enum OtlpValue<'a> {
    #[serde(rename = "intValue")]
    Int(String),
    #[serde(rename = "doubleValue")]
    Double(f64),
    #[serde(rename = "stringValue")]
    Str(&'a str),
}

#[derive(Serialize)]
struct OtlpKeyValue<'a> {
    key: &'a str,
    value: OtlpValue<'a>,
}

fn otlp_attrs(attrs: &[(String, AttrValue)]) -> Vec<OtlpKeyValue<'_>> {
    attrs
        .iter()
        .map(|(k, v)| OtlpKeyValue {
            key: k,
            value: match v {
                AttrValue::Int(i) => OtlpValue::Int(i.to_string()),
                AttrValue::Double(d) => OtlpValue::Double(*d),
                AttrValue::Str(s) => OtlpValue::Str(s),
            },
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpEvent<'a> {
    time_unix_nano: String,
    name: &'a str,
    attributes: Vec<OtlpKeyValue<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpLink<'a> {
    trace_id: &'a str,
    span_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpSpan<'a> {
    trace_id: &'a str,
    span_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<&'a str>,
    name: &'a str,
    /// SPAN_KIND_INTERNAL.
    kind: u8,
    start_time_unix_nano: String,
    end_time_unix_nano: String,
    attributes: Vec<OtlpKeyValue<'a>>,
    events: Vec<OtlpEvent<'a>>,
    links: Vec<OtlpLink<'a>>,
}

/// `spans` as OTLP/JSON `ExportTraceServiceRequest` text (what an OTLP/HTTP collector takes
/// at `/v1/traces` with `Content-Type: application/json`), under a resource named `service`.
pub fn otlp_json(spans: &[Span], service: &str, version: &str) -> String {
    let spans: Vec<OtlpSpan<'_>> = spans
        .iter()
        .map(|s| OtlpSpan {
            trace_id: &s.trace_id,
            span_id: &s.span_id,
            parent_span_id: s.parent_span_id.as_deref(),
            name: &s.name,
            kind: 1,
            start_time_unix_nano: s.start_unix_ns.to_string(),
            end_time_unix_nano: s.end_unix_ns.to_string(),
            attributes: otlp_attrs(&s.attributes),
            events: s
                .events
                .iter()
                .map(|e| OtlpEvent {
                    time_unix_nano: e.time_unix_ns.to_string(),
                    name: &e.name,
                    attributes: otlp_attrs(&e.attributes),
                })
                .collect(),
            links: s
                .links
                .iter()
                .map(|(t, id)| OtlpLink {
                    trace_id: t,
                    span_id: id,
                })
                .collect(),
        })
        .collect();
    let service = [OtlpKeyValue {
        key: "service.name",
        value: OtlpValue::Str(service),
    }];
    let request = OtlpRequest {
        resource_spans: [OtlpResourceSpans {
            resource: OtlpResource {
                attributes: &service,
            },
            scope_spans: [OtlpScopeSpans {
                scope: OtlpScope {
                    name: "stepscope",
                    version,
                },
                spans,
            }],
        }],
    };
    // Plain structs of strings and numbers: serializing them cannot fail.
    serde_json::to_string(&request).unwrap_or_default()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpRequest<'a> {
    resource_spans: [OtlpResourceSpans<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpResourceSpans<'a> {
    resource: OtlpResource<'a>,
    scope_spans: [OtlpScopeSpans<'a>; 1],
}

#[derive(Serialize)]
struct OtlpResource<'a> {
    attributes: &'a [OtlpKeyValue<'a>],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpScopeSpans<'a> {
    scope: OtlpScope<'a>,
    spans: Vec<OtlpSpan<'a>>,
}

#[derive(Serialize)]
struct OtlpScope<'a> {
    name: &'a str,
    version: &'a str,
}

/// `spans` as an OTLP protobuf `ExportTraceServiceRequest` (opentelemetry-proto's
/// `collector/trace/v1`), the same message as [`otlp_json`]'s.
pub fn otlp_protobuf(spans: &[Span], service: &str, version: &str) -> Vec<u8> {
    let mut scope_spans = Vec::new();
    {
        let mut scope = Vec::new();
        pb::string(&mut scope, 1, "stepscope");
        pb::string(&mut scope, 2, version);
        pb::message(&mut scope_spans, 1, &scope);
    }
    let mut span = Vec::new();
    for s in spans {
        span.clear();
        pb::bytes(&mut span, 1, &pb::hex(&s.trace_id));
        pb::bytes(&mut span, 2, &pb::hex(&s.span_id));
        if let Some(p) = &s.parent_span_id {
            pb::bytes(&mut span, 4, &pb::hex(p));
        }
        pb::string(&mut span, 5, &s.name);
        // SPAN_KIND_INTERNAL.
        pb::varint_field(&mut span, 6, 1);
        pb::fixed64(&mut span, 7, s.start_unix_ns);
        pb::fixed64(&mut span, 8, s.end_unix_ns);
        for (k, v) in &s.attributes {
            pb::key_value(&mut span, 9, k, v);
        }
        for e in &s.events {
            let mut event = Vec::new();
            pb::fixed64(&mut event, 1, e.time_unix_ns);
            pb::string(&mut event, 2, &e.name);
            for (k, v) in &e.attributes {
                pb::key_value(&mut event, 3, k, v);
            }
            pb::message(&mut span, 11, &event);
        }
        for (t, id) in &s.links {
            let mut link = Vec::new();
            pb::bytes(&mut link, 1, &pb::hex(t));
            pb::bytes(&mut link, 2, &pb::hex(id));
            pb::message(&mut span, 13, &link);
        }
        pb::message(&mut scope_spans, 2, &span);
    }
    let mut resource = Vec::new();
    pb::key_value(
        &mut resource,
        1,
        "service.name",
        &AttrValue::Str(service.into()),
    );
    let mut resource_spans = Vec::new();
    pb::message(&mut resource_spans, 1, &resource);
    pb::message(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::with_capacity(resource_spans.len() + 8);
    pb::message(&mut out, 1, &resource_spans);
    out
}

/// Protobuf's wire format, as much of it as OTLP's trace messages use.
mod pb {
    use super::AttrValue;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
        varint(out, (u64::from(field) << 3) | u64::from(wire));
    }

    pub fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
        tag(out, field, 0);
        varint(out, v);
    }

    pub fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
        tag(out, field, 1);
        out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
        tag(out, field, 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    pub fn string(out: &mut Vec<u8>, field: u32, s: &str) {
        bytes(out, field, s.as_bytes());
    }

    pub fn message(out: &mut Vec<u8>, field: u32, m: &[u8]) {
        bytes(out, field, m);
    }

    /// A `KeyValue` (key 1, `AnyValue` 2: string 1, int 3, double 4).
    pub fn key_value(out: &mut Vec<u8>, field: u32, key: &str, v: &AttrValue) {
        let mut any = Vec::new();
        match v {
            AttrValue::Str(s) => string(&mut any, 1, s),
            // int64 as a varint: two's complement.
            AttrValue::Int(i) => varint_field(&mut any, 3, *i as u64),
            AttrValue::Double(d) => {
                tag(&mut any, 4, 1);
                any.extend_from_slice(&d.to_le_bytes());
            }
        }
        let mut kv = Vec::with_capacity(key.len() + any.len() + 4);
        string(&mut kv, 1, key);
        message(&mut kv, 2, &any);
        message(out, field, &kv);
    }

    /// An id's bytes from its hex digits (the spans' ids are the builder's: well formed).
    pub fn hex(h: &str) -> Vec<u8> {
        h.as_bytes()
            .chunks(2)
            .map(|p| {
                let d = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                (d(p[0]) << 4) | p.get(1).map_or(0, |&c| d(c))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::SpanEvent;
    use serde_json::Value;

    fn span() -> Span {
        Span {
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            span_id: "b7ad6b7169203331".into(),
            parent_span_id: Some("00f067aa0ba902b7".into()),
            name: "stepscope.engine".into(),
            start_unix_ns: 50_000_000,
            end_unix_ns: 330_000_000,
            attributes: vec![
                ("gen_ai.usage.input_tokens".into(), AttrValue::Int(8)),
                (
                    "stepscope.decode.step.max_ms".into(),
                    AttrValue::Double(1.5),
                ),
                ("stepscope.finish".into(), AttrValue::Str("length".into())),
            ],
            events: vec![SpanEvent {
                name: "stepscope.preempted".into(),
                time_unix_ns: 60_000_000,
                attributes: vec![("stepscope.step".into(), AttrValue::Int(5))],
            }],
            links: vec![(
                "0af7651916cd43dd8448eb211c80319d".into(),
                "b7ad6b7169203332".into(),
            )],
        }
    }

    #[test]
    fn otlp_json_writes_ids_in_hex_and_64_bit_integers_and_times_as_strings() {
        let doc: Value = serde_json::from_str(&otlp_json(&[span()], "svc", "0.1.0")).unwrap();
        let rs = &doc["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "svc"
        );
        assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "stepscope");
        let s = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(s["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(s["kind"], 1);
        assert_eq!(s["startTimeUnixNano"], "50000000");
        assert_eq!(s["attributes"][0]["value"]["intValue"], "8");
        assert_eq!(s["attributes"][1]["value"]["doubleValue"], 1.5);
        assert_eq!(s["events"][0]["timeUnixNano"], "60000000");
        assert_eq!(s["links"][0]["spanId"], "b7ad6b7169203332");
    }

    #[test]
    fn otlp_protobuf_ids_are_bytes_and_times_fixed64() {
        let bytes = otlp_protobuf(&[span()], "svc", "0.1.0");
        // The trace id's 16 bytes (field 1 of a Span, length 16) and the start time as a
        // little-endian fixed64 (field 7) stand in the message; the whole message is decoded by
        // the official messages in tests/python/test_otel.py.
        let id = pb::hex("0af7651916cd43dd8448eb211c80319c");
        let mut field = vec![0x0a, 16];
        field.extend_from_slice(&id);
        assert!(bytes.windows(field.len()).any(|w| w == field.as_slice()));
        let mut start = vec![(7 << 3) | 1];
        start.extend_from_slice(&50_000_000u64.to_le_bytes());
        assert!(bytes.windows(start.len()).any(|w| w == start.as_slice()));
        assert_eq!(
            bytes[0], 0x0a,
            "field 1 of ExportTraceServiceRequest, a message"
        );
    }
}
