//! What running a graph on the interpreter holds in memory, and the check
//! that it fits a budget before anything is allocated.
//!
//! The interpreter keeps the inputs for the whole run and each other value
//! from the op that defines it to its last use (`run_block`); a `fused`
//! region's own values live while the region runs. [`peak_bytes`] replays
//! that order over the value sizes; scratch copies inside an op (an f16
//! operand widened to f32, say) come on top, so the budget compares the
//! values' bytes, a lower bound of the process's memory.

use dcir_ir::{BlockId, Graph, ValueDef, ValueId};

use crate::InterpError;

/// The peak of the values a run holds at once, and the largest of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peak {
    /// Bytes of the values alive at the worst point of the run.
    pub bytes: u128,
    /// The largest value of the graph (by bytes; the first of equals), if it has any.
    pub largest: Option<ValueId>,
}

/// Bytes of `v` (a verified graph's sizes never overflow; saturated anyway).
fn bytes_of(graph: &Graph, v: ValueId) -> u128 {
    graph.ty(v).size_bytes().map_or(u128::MAX, |b| b as u128)
}

/// The peak memory of running `graph` on the interpreter: its inputs plus
/// the most bytes of other values alive at once.
pub fn peak_bytes(graph: &Graph) -> Peak {
    let inputs: u128 = graph
        .params()
        .iter()
        .map(|&p| bytes_of(graph, p))
        .fold(0, u128::saturating_add);
    // The first of the largest, in definition order.
    let largest = graph
        .value_ids()
        .max_by_key(|&v| (bytes_of(graph, v), std::cmp::Reverse(v.index())));
    Peak {
        bytes: inputs.saturating_add(block_peak(graph, graph.body())),
        largest,
    }
}

/// The most bytes of values defined in `block` (its ops' results and, for a
/// region, its ops' own regions) alive at once, freed after their last use.
fn block_peak(graph: &Graph, block: BlockId) -> u128 {
    let ops = &graph.block(block).ops;
    let mut last_use = vec![None; graph.value_count()];
    for (pos, &op) in ops.iter().enumerate() {
        for &v in &graph.op(op).operands {
            last_use[v.index()] = Some(pos);
        }
    }
    let (mut live, mut peak) = (0u128, 0u128);
    for (pos, &op) in ops.iter().enumerate() {
        let data = graph.op(op);
        let inner = data.region.map_or(0, |r| block_peak(graph, r));
        let results: u128 = data
            .results
            .iter()
            .map(|&r| bytes_of(graph, r))
            .fold(0, u128::saturating_add);
        peak = peak.max(live.saturating_add(inner).saturating_add(results));
        live = live.saturating_add(results);
        // Values defined in this block whose last use is this op are freed.
        for &v in &data.operands {
            let defined_here = match graph.value(v).def {
                ValueDef::OpResult { op, .. } => graph.op(op).parent == Some(block),
                ValueDef::BlockArg { .. } => false,
            };
            if defined_here && last_use[v.index()] == Some(pos) {
                live = live.saturating_sub(bytes_of(graph, v));
                last_use[v.index()] = None;
            }
        }
    }
    peak
}

/// Bytes of `graph`'s inputs and outputs: what the host holds when the
/// graph runs elsewhere (on the GPU).
pub fn io_bytes(graph: &Graph) -> u128 {
    graph
        .params()
        .iter()
        .chain(graph.outputs().unwrap_or_default().iter())
        .map(|&v| bytes_of(graph, v))
        .fold(0, u128::saturating_add)
}

/// `Ok` when `needed` bytes (what running `graph` holds, `what` says how)
/// fit `budget` (whose origin `source` names); else an error naming the
/// need, the budget and the graph's largest value.
pub fn check_budget(
    graph: &Graph,
    needed: u128,
    what: &str,
    budget: u64,
    source: &str,
) -> Result<(), InterpError> {
    if needed <= u128::from(budget) {
        return Ok(());
    }
    let largest = peak_bytes(graph)
        .largest
        .map(|v| {
            format!(
                "; the largest value is %{}: {} ({})",
                graph.value(v).name,
                graph.ty(v),
                human_bytes(bytes_of(graph, v))
            )
        })
        .unwrap_or_default();
    Err(InterpError::Data(format!(
        "@{} needs {} of memory {what}, more than the budget of {} ({source}){largest}",
        graph.name(),
        human_bytes(needed),
        human_bytes(u128::from(budget)),
    )))
}

/// A size such as `512`, `64K`, `1.5G` or `2TiB` (binary units), in bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (a number of bytes, or with K, M, G or T)"))?;
    let scale: u64 = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        "T" | "t" => 1 << 40,
        other => {
            return Err(format!(
                "`{other}` in `{text}` is not a unit (K, M, G or T)"
            ));
        }
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes as u64)
}

/// `1536` -> `1.5 KiB`; exact bytes below 1 KiB.
pub fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The memory this machine has available (`MemAvailable` of
/// `/proc/meminfo`), when it can be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(text: &str) -> Graph {
        let module = dcir_reader::parse_module(text).expect("parses");
        module.graphs.into_iter().next().expect("one graph")
    }

    #[test]
    fn values_are_freed_after_their_last_use() {
        // x (400 B) lives throughout; a (400) and b (400) overlap; c reuses a's room.
        let g = graph(
            "graph @g(%x: f32[100]) -> (f32[100]) {\n  %a = relu %x : f32[100]\n  %b = neg %a : f32[100]\n  %c = abs %b : f32[100]\n  return %c\n}\n",
        );
        assert_eq!(peak_bytes(&g).bytes, 400 + 800);
    }

    #[test]
    fn an_oversized_graph_is_refused_naming_its_largest_value() {
        let g = graph(
            "graph @g(%x: f32[100000,100000,100000]) -> (f32[100000,100000,100000]) {\n  %y = relu %x : f32[100000,100000,100000]\n  return %y\n}\n",
        );
        let need = peak_bytes(&g).bytes;
        let e = check_budget(&g, need, "to run", 1 << 30, "--memory-budget")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("7.1 PiB of memory to run") && e.contains("1.0 GiB"),
            "{e}"
        );
        assert_eq!(io_bytes(&g), need);
        assert!(e.contains("%x: f32[100000,100000,100000] (3.6 PiB)"), "{e}");
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("3X").unwrap_err().contains("not a unit"));
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
