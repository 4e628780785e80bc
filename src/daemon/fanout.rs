//! Work over many agents spread across a few threads: the file-system reads
//! of a start or a reload at 10,000 agents (each agent's own files, no
//! shared state), before the loop runs. Order is kept.

/// Below this many items a thread costs more than it saves.
const MIN_PER_THREAD: usize = 256;

/// `f` over every item, on up to `available_parallelism()` (at most 4)
/// threads, the results in the items' order. A panic in `f` is resumed on
/// the caller's thread.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4)
        .min(items.len() / MIN_PER_THREAD)
        .max(1);
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_at_every_size() {
        for n in [0, 1, 255, 256, 513, 2000, 10_001] {
            let items: Vec<usize> = (0..n).collect();
            let out = super::map(&items, |i| i * 2);
            assert_eq!(
                out,
                items.iter().map(|i| i * 2).collect::<Vec<_>>(),
                "n = {n}"
            );
        }
    }
}
