//! File descriptors for `proxy.max_clients`: raised at start as far as the hard limit lets,
//! and the client limit lowered to what they cover when it cannot be (as Valkey does with
//! `maxclients`): a client past the descriptors would otherwise hang in the accept queue
//! instead of getting `-ERR max number of clients reached`.

/// Descriptors walrus needs besides its clients': the journal's segments, the pool, the
/// listeners, checkpoints, logs and the managed Valkey's pipes, with room to spare.
const RESERVED_FDS: u64 = 128;

/// A client's socket. A pinned session (MULTI, SUBSCRIBE, a blocking command) takes one
/// more for its dedicated connection to Valkey; when none is left, that client gets an error
/// reply, while a client the accept loop could not take would wait unanswered: the limit
/// is sized for the accepts, as Valkey sizes it for `maxclients`.
const FDS_PER_CLIENT: u64 = 1;

/// Raises the soft `RLIMIT_NOFILE` towards what `max_clients` needs; returns the number of
/// clients the limit covers (`max_clients`, or fewer, with a warning).
pub fn size_for_clients(max_clients: usize, journal_segments: u32) -> usize {
    let needed = max_clients as u64 * FDS_PER_CLIENT + RESERVED_FDS + u64::from(journal_segments);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a struct this function owns.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return max_clients;
    }
    if lim.rlim_cur < needed {
        let raised = libc::rlimit {
            rlim_cur: needed.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = lim.rlim_cur,
                to = raised.rlim_cur,
                "raised the open files limit for proxy.max_clients"
            );
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    if lim.rlim_cur >= needed {
        return max_clients;
    }
    let covered = (lim
        .rlim_cur
        .saturating_sub(RESERVED_FDS + u64::from(journal_segments))
        / FDS_PER_CLIENT)
        .max(1) as usize;
    tracing::warn!(
        "the open files limit ({}, hard {}) covers {covered} clients, not proxy.max_clients = {max_clients} ({needed} descriptors): \
         serving at most {covered}; raise the limit (LimitNOFILE, ulimit -n) to serve more",
        lim.rlim_cur,
        lim.rlim_max
    );
    covered
}
