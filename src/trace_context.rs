//! W3C trace context carried with a job: the producer's span is written as a `traceparent` with
//! the job's row (it travels through retries, snoozes, parking and dead-letter retries), and each
//! execution's `ringwork.process` span names it as its parent. Spans reach OpenTelemetry through
//! tracing-opentelemetry; without its layer installed there is no context to take or to set.
//!
//! A row stores the traceparent's 25 bytes (trace id, span id, flags; migration 0017), not its 55
//! characters: with every job traced, the text was 16 % of the WAL a job writes. Inserts send the
//! text (SQL converts it, COPY gets `copy_literal`) and claim returns the text.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// `00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex>`, neither id all zeros: the rule
/// `valid_traceparent` in sql/functions/queue_ring.sql applies to SQL producers.
pub(crate) fn is_valid(traceparent: &str) -> bool {
    parse(traceparent).is_some()
}

fn parse(traceparent: &str) -> Option<SpanContext> {
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = traceparent.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || version != "00"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
        || ![trace, span, flags].iter().all(|p| lower_hex(p))
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// A valid traceparent's text as a bytea literal for COPY (`\x` and the 50 hex digits of its 25
/// stored bytes: the text without its version and dashes).
pub(crate) fn copy_literal(traceparent: &str) -> String {
    format!(
        "\\x{}{}{}",
        &traceparent[3..35],
        &traceparent[36..52],
        &traceparent[53..55]
    )
}

fn format(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

/// The traceparent of the span the caller is in: the current `tracing` span's OpenTelemetry
/// context, else OpenTelemetry's own current context. None outside any trace.
pub(crate) fn current_traceparent() -> Option<String> {
    let from_tracing = tracing::Span::current().context();
    [from_tracing, Context::current()]
        .iter()
        .map(|cx| cx.span().span_context().clone())
        .find(SpanContext::is_valid)
        .map(|context| format(&context))
}

/// Make `span` a child of the producer's span named by `traceparent` (ignored when it is absent or
/// malformed, or no OpenTelemetry layer is installed).
pub(crate) fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(parent) = traceparent.and_then(parse) {
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_w3c_traceparents() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse(text).expect("valid");
        assert_eq!(format(&parsed), text);
        assert!(parsed.is_sampled());
        let literal = copy_literal(text);
        assert_eq!(
            literal,
            "\\x4bf92f3577b34da6a3ce929d0e0e473600f067aa0ba902b701"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad:?} was accepted");
        }
    }
}
