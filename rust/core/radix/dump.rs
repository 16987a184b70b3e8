//! Debug views of the tree: a human-readable dump and the list of cached
//! sequences. Read-only; for tests, debugging and the Python `dump()`.
//!
//! # Costs
//! `dump`: O(nodes log nodes + owing nodes × depth). `sequences`: O(total tokens × depth).
//!
//! Read-only, so no invariants of its own.

use std::fmt::Write as _;

use super::{NodeId, RadixTree};

impl RadixTree {
    /// A human-readable dump: one line per node, depth-first, children in
    /// `(namespace, first token, id)` order; hit counts and stamps include
    /// what extensions still owe (module docs, recency).
    /// O(nodes log nodes + owing nodes × depth).
    #[must_use]
    pub fn dump(&self) -> String {
        let mut s = format!(
            "RadixTree(page_size={}, policy={}, nodes={}, total={}, evictable={}, protected={}, clock={})\n",
            self.page_size,
            self.policy.name(),
            self.num_nodes,
            self.total_size(),
            self.evictable_size,
            self.protected_size,
            self.clock
        );
        // Hit counts and stamps as the per-node walk would have left them.
        let settled = self.settled_all();
        let mut stack = vec![(NodeId::ROOT, 0usize)];
        while let Some((id, depth)) = stack.pop() {
            let n = &self.nodes[id.idx()];
            if id == NodeId::ROOT {
                s.push_str("root r=1\n");
            } else {
                let head: Vec<String> = n.key.iter().take(10).map(i32::to_string).collect();
                let more = if n.key.len() > 10 { " ..." } else { "" };
                let ns = self.ns.name(n.ns).map(|x| format!(" ns={x:?}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{:indent$}#{} len={}{ns} [{}{more}] r={} own={} t={} c={} hits={} prio={}",
                    "",
                    self.handle(id).0,
                    n.key.len(),
                    head.join(" "),
                    n.lock_ref,
                    n.own_locks,
                    settled[id.idx()].1,
                    n.created,
                    settled[id.idx()].0,
                    n.priority,
                    indent = 2 * depth
                );
            }
            let mut kids = self.children_of(id);
            kids.sort_by_key(|&c| (self.nodes[c.idx()].ns, self.nodes[c.idx()].key.first().copied(), c));
            stack.extend(kids.into_iter().rev().map(|c| (c, depth + 1)));
        }
        s
    }

    /// Every cached sequence: the token path of each leaf with its namespace.
    /// For tests and debugging. O(total tokens × depth).
    #[must_use]
    pub fn sequences(&self) -> Vec<(Option<String>, Vec<i32>)> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if n.live && !n.has_children() {
                let mut toks = Vec::new();
                #[allow(clippy::cast_possible_truncation)]
                let mut cur = NodeId(i as u32);
                while cur != NodeId::ROOT {
                    toks.extend(self.nodes[cur.idx()].key.iter().rev());
                    cur = self.nodes[cur.idx()].parent;
                }
                toks.reverse();
                out.push((self.ns.name(n.ns).map(str::to_owned), toks));
            }
        }
        out.sort();
        out
    }
}
