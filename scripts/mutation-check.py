#!/usr/bin/env python3
"""Mutation check: do the tests fail when the code is wrong?

    scripts/mutation-check.py [--list] [NAME...]

Each mutant below breaks one rule of the data path, the security checks or
the isolation machinery on purpose (a one-place text edit), runs the tests
that should notice, and puts the file back. A mutant the tests do not kill
is a test gap: data that is never checked, or a check that cannot fail.
A mutant whose tests run past the time limit is reported as HANG (a test
that waits without bound is a defect of its own). A mutant whose text no
longer occurs is STALE: update it with the code.

Exit status: 0 when every mutant is killed, 1 otherwise. Not part of
scripts/test.sh (it rebuilds and tests a crate per mutant: about 30 minutes in
all). Needs a clean working tree for the files it edits.
"""
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_S = 600


def t(*crates, extra=()):
    cmd = ["cargo", "test", "--no-fail-fast"]
    for c in crates:
        cmd += ["-p", c]
    return cmd + list(extra)


MUTANTS = [
    # Data placement and content.
    ("shared-read-ignores-its-offset", "crates/sluice-bytes/src/lib.rs",
     "range: at + sub.start..at + sub.end,",
     "range: sub.start..sub.end,", t("sluice-bytes", "sluice-target")),
    ("ram-partial-zero-skipped", "crates/sluice-backend/src/ram.rs",
     "                data[at..at + range.len()].fill(0);", "", t("sluice-backend")),
    ("ram-no-copy-on-write", "crates/sluice-backend/src/ram.rs",
     "    if Arc::get_mut(mem).is_none() {\n        let mut copy",
     "    if false && Arc::get_mut(mem).is_none() {\n        let mut copy", t("sluice-backend")),
    ("file-write-offset", "crates/sluice-backend/src/file/sync_engine.rs",
     ".write_all_at(buf.as_slice(), offset_bytes)",
     ".write_all_at(buf.as_slice(), offset_bytes % 4096)", t("sluice-backend")),
    ("h2c-data-at-buffer-start", "crates/sluice-target/src/queue/data.rs",
     "buf[d.offset as usize..end as usize].copy_from_slice(data);",
     "buf[..data.len()].copy_from_slice(data);", t("sluice-target")),
    ("dsm-first-range-only", "crates/sluice-target/src/queue/execute.rs",
     "                ops.push((o, l));", "                if ops.is_empty() { ops.push((o, l)); }",
     t("sluice-target")),
    ("write-zeroes-half", "crates/sluice-target/src/queue/admit.rs",
     "                            offset_bytes,\n                            len_bytes,\n                        )],",
     "                            offset_bytes,\n                            (len_bytes / 2).max(4096),\n                        )],",
     t("sluice-target")),
    ("volume-drive-offset-ignores-slot", "crates/sluice-volume/src/map.rs",
     "        replica.slot * EXTENT_BYTES + self.offset_in_extent",
     "        self.offset_in_extent", t("sluice-control", extra=["--test", "volumes"])),
    ("chain-writes-head-only", "crates/sluice-control/src/volume.rs",
     "            for (i, replica) in m.chain.iter().enumerate() {",
     "            for (i, replica) in m.chain.iter().enumerate().take(1) {",
     t("sluice-control", extra=["--test", "volumes", "--test", "rebuild"])),
    ("rebuild-copies-nothing", "crates/sluice-control/src/rebuild.rs",
     "            dst.write(dst_lba + at / bs, &data, flags)\n                .await",
     "            let _ = &data; dst.flush()\n                .await",
     t("sluice-control", extra=["--test", "rebuild"])),
    ("nbd-lba-wraps", "crates/sluice-export/src/nbd/direct.rs",
     "                    offset / bs,\n                    buf,",
     "                    (offset / bs) % 256,\n                    buf,", t("sluice-export")),
    ("nbd-write-zeroes-noop", "crates/sluice-export/src/blockio.rs",
     "        Namespace::write_zeroes(self, lba, blocks).await",
     "        let _ = (lba, blocks); Ok(())", t("sluice-export")),
    ("nbd-trim-noop", "crates/sluice-export/src/blockio.rs",
     "        Namespace::deallocate(self, lba, blocks).await",
     "        let _ = (lba, blocks); Ok(())", t("sluice-export")),
    ("fuse-fallocate-offset", "crates/sluice-export/src/fuse/ops.rs",
     "        Ok((offset < end).then(|| (offset, end - offset)))",
     "        Ok((offset < end).then(|| (0, end - offset)))", t("sluice-export")),
    ("host-data-order-unchecked", "crates/sluice-host/src/core.rs",
     "    if offset != expected {\n        return Err(DecodeError::invalid(",
     "    if false && offset != expected {\n        return Err(DecodeError::invalid(",
     t("sluice-host", extra=["--test", "conformance"])),
    ("host-data-range-unchecked", "crates/sluice-host/src/core.rs",
     "offset.checked_add(len).filter(|&e| e as usize <= buf_len) else {",
     "offset.checked_add(len).filter(|&e| e as usize <= buf_len || e > 0) else {",
     t("sluice-host", extra=["--test", "conformance"])),
    # Hostile or wrong input (the wire, NBD requests).
    ("header-digest-unchecked", "crates/sluice-proto/src/framer.rs",
     "            if received != computed {\n                return Err(DecodeError::HeaderDigest { received, computed });",
     "            if false && received != computed {\n                return Err(DecodeError::HeaderDigest { received, computed });",
     t("sluice-proto", "sluice-target")),
    ("split-header-digest-unchecked", "crates/sluice-proto/src/framer.rs",
     "            if received == computed {\n                decode_specific(",
     "            if true || received == computed {\n                decode_specific(",
     t("sluice-proto", "sluice-target")),
    ("framer-data-digest-unchecked", "crates/sluice-proto/src/framer.rs",
     "                    u32_at(b, at) == crc32c(data)", "                    u32_at(b, at) == crc32c(data) || true",
     t("sluice-proto", "sluice-target", "sluice-host")),
    ("target-in-place-data-digest-unchecked", "crates/sluice-target/src/queue/data.rs",
     "Some(r) => buf.is_none_or(|b| crc32c(&b[from..from + len]) == r),",
     "Some(r) => buf.is_none_or(|b| crc32c(&b[from..from + len]) == r || true),", t("sluice-target")),
    ("host-in-place-data-digest-unchecked", "crates/sluice-host/src/core.rs",
     ".map(|buf| crc32c(&buf[from..from + len]) == received)",
     ".map(|buf| crc32c(&buf[from..from + len]) == received || true)", t("sluice-host")),
    ("pdu-data-limit-unchecked", "crates/sluice-proto/src/pdu.rs",
     "    if data_len > p.data_len_max as usize {", "    if false && data_len > p.data_len_max as usize {",
     t("sluice-proto", "sluice-target")),
    ("queue-depth-unbounded", "crates/sluice-target/src/queue/admit.rs",
     "        if self.cmds.outstanding() >= depth {", "        if false && self.cmds.outstanding() >= depth {",
     t("sluice-target")),
    ("lba-range-unchecked", "crates/sluice-target/src/queue/admit.rs",
     "                    Some(end) if ns.holds(end) => {}", "                    Some(_end) => {}",
     t("sluice-target", "sluice-pair")),
    ("sgl-length-mismatch-accepted", "crates/sluice-target/src/queue/admit.rs",
     "                if sgl_len as u64 != len_bytes {", "                if false && sgl_len as u64 != len_bytes {",
     t("sluice-target")),
    ("io-while-controller-disabled", "crates/sluice-target/src/queue/admit.rs",
     "        if !ctrl.is_ready() {\n            return Err(Status::COMMAND_SEQUENCE_ERROR);",
     "        if false && !ctrl.is_ready() {\n            return Err(Status::COMMAND_SEQUENCE_ERROR);",
     t("sluice-target")),
    ("io-queue-joins-another-hosts-controller", "crates/sluice-target/src/queue/handshake.rs",
     "            if ctrl.hostnqn != cd.hostnqn {", "            if false && ctrl.hostnqn != cd.hostnqn {",
     t("sluice-target")),
    ("nbd-past-end-accepted", "crates/sluice-export/src/nbd/proto.rs",
     "        .is_some_and(|e| e <= session.size_bytes.unwrap_or(export.size_bytes));",
     "        .is_some_and(|e| e <= session.size_bytes.unwrap_or(export.size_bytes) || true);",
     t("sluice-export")),
    ("nbd-read-only-writable", "crates/sluice-export/src/nbd/proto.rs",
     "    if writes && export.read_only {", "    if false && writes && export.read_only {", t("sluice-export")),
    # Metadata.
    ("meta-compare-ignored", "crates/sluice-meta/src/redb_store.rs",
     "                    if !holds {", "                    if false && !holds {", t("sluice-meta")),
    # Security.
    ("any-host-admitted", "crates/sluice-target/src/subsystem.rs",
     "        self.allow_any_host || self.hosts.contains(hostnqn)\n",
     "        let _ = hostnqn; true\n", t("sluice-target")),
    ("controller-accepts-any-response", "crates/sluice-auth/src/controller.rs",
     "                if !crypto::equal(&expect, &r.response) {",
     "                if false && !crypto::equal(&expect, &r.response) {", t("sluice-auth", "sluice-target")),
    ("host-accepts-any-controller", "crates/sluice-auth/src/host.rs",
     "        if !crypto::equal(&expect, &r2) {", "        if false && !crypto::equal(&expect, &r2) {",
     t("sluice-auth", "sluice-host")),
    ("io-before-authentication", "crates/sluice-target/src/queue/admit.rs",
     "        if sqe.opcode() != admin::FABRICS\n            && self",
     "        if false && sqe.opcode() != admin::FABRICS\n            && self", t("sluice-target")),
    ("no-authentication-deadline", "crates/sluice-target/src/queue/mod.rs",
     "            && now >= self.session.auth_deadline(&self.reg)",
     "            && now >= self.session.auth_deadline(&self.reg) && false", t("sluice-target")),
    ("chain-epoch-fence-ignored", "crates/sluice-target/src/fence.rs",
     "                if gs.iter().any(|g| epoch < g.fence.load(SeqCst)) {",
     "                if false && gs.iter().any(|g| epoch < g.fence.load(SeqCst)) {", t("sluice-target")),
    # Timers.
    ("host-command-timeout-never", "crates/sluice-host/src/core.rs",
     "                    if slot.held || slot.deadline > now {\n                        continue;\n                    }",
     "                    if true || slot.deadline > now {\n                        continue;\n                    }",
     t("sluice-host")),
    ("keep-alive-never-expires", "crates/sluice-target/src/queue/mod.rs",
     "                if now >= d {\n                    tracing::warn!(",
     "                if false && now >= d {\n                    tracing::warn!(", t("sluice-target")),
    # Isolation.
    ("fair-queue-weights-ignored", "crates/sluice-target/src/tenant/fair.rs",
     "q.finish = start + u128::from(p.cost) * SCALE / u128::from(q.params.weight.max(1));",
     "q.finish = start + u128::from(p.cost) * SCALE;", t("sluice-target")),
    ("token-bucket-always-allows", "crates/sluice-target/src/tenant/rate.rs",
     "        let need = i128::from(n.min(self.capacity)) * NANO;\n        self.tokens >= need\n    }",
     "        let need = i128::from(n.min(self.capacity)) * NANO;\n        true || self.tokens >= need\n    }",
     t("sluice-target")),
    ("cpu-never-throttled", "crates/sluice-cpu/src/lib.rs",
     "            Some(u) if now < u => true,", "            Some(u) if now < u => false,",
     t("sluice-cpu", "sluice-target")),
    ("cpu-charged-to-first-tenant", "crates/sluice-cpu/src/lib.rs",
     "                let share = (u128::from(cpu_ns) * u / total) as u64;",
     "                let share = if j == 0 { cpu_ns } else { 0 } + 0 * (u128::from(cpu_ns) * u / total) as u64;",
     t("sluice-cpu", "sluice-target")),
    ("send-priorities-flat", "crates/sluice-proto/src/send.rs",
     "            PduClass::R2t => self.weights.r2t,", "            PduClass::R2t => self.weights.data,",
     t("sluice-proto")),
    ("urgent-hint-ignored", "crates/sluice-proto/src/coalesce.rs",
     "                    Hint::Urgent if self.cfg.urgent_out_of_order => {",
     "                    Hint::Urgent if false && self.cfg.urgent_out_of_order => {", t("sluice-proto")),
    ("barrier-hint-ignored", "crates/sluice-proto/src/coalesce.rs",
     "                        if self.outstanding.range(..s).next().is_none() {",
     "                        if true || self.outstanding.range(..s).next().is_none() {", t("sluice-proto")),
    # Operations: memory handed back, slow backend I/O seen, hosts told at
    # shutdown.
    ("shutdown-waits-for-backends-first", "crates/sluice-target/src/server/worker.rs",
     "        for i in 0..self.conns.len() {\n            self.remove_conn(i);\n        }\n        self.flush_backends();",
     "        self.flush_backends();\n        for i in 0..self.conns.len() {\n            self.remove_conn(i);\n        }",
     t("sluice-target", extra=["--test", "loopback"])),
    ("trim-skips-a-waves-tail", "crates/sluice-target/src/admission.rs",
     "        } else if s.open_at_wave_trim.is_some_and(|o| s.open < o) {",
     "        } else if false && s.open_at_wave_trim.is_some_and(|o| s.open < o) {",
     t("sluice-target", extra=["--lib", "--test", "flood"])),
    ("slow-io-timed-from-arrival", "crates/sluice-target/src/tenant/worker.rs",
     "                m.dispatched = now;\n", "", t("sluice-target", extra=["--lib"])),
    ("slow-io-not-counted", "crates/sluice-target/src/tenant/worker.rs",
     "        ns.slow_ios.fetch_add(1, Relaxed);\n", "",
     t("sluice-target", extra=["--test", "admin"])),
    # A reload: access swapped in, refused hosts' controllers failed.
    ("reload-keeps-refused-controllers", "crates/sluice-target/src/reload.rs",
     "                c.fail();\n", "", t("sluice-target", extra=["--test", "reload"])),
    ("reload-keeps-old-access", "crates/sluice-target/src/reload.rs",
     "            sub.set_access(access);\n", "            drop(access);\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-skips-tenants", "crates/sluice-target/src/reload.rs",
     "        .replace_tenants(&changed, &tenants_deleted)\n", "        .replace_tenants(&changed[..0], &tenants_deleted)\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-keeps-removed-tenants", "crates/sluice-target/src/reload.rs",
     "        .replace_tenants(&changed, &tenants_deleted)\n", "        .replace_tenants(&changed, &tenants_deleted[..0])\n",
     t("sluice-target", extra=["--test", "reload"])),
    # A reload adds and removes subsystems: removed ones leave the table and
    # fail their controllers, namespace indices are never handed out twice,
    # and workers drop their queues of retired namespaces.
    ("reload-keeps-removed-subsystems", "crates/sluice-target/src/registry.rs",
     "        let gone = removed.iter().filter_map(|nqn| map.remove(nqn)).collect();\n",
     "        let gone = removed.iter().filter_map(|nqn| map.get(nqn).cloned()).collect();\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("removed-subsystem-keeps-controllers", "crates/sluice-target/src/registry.rs",
     "            for c in t.live.values() {\n                c.fail();\n",
     "            for c in t.live.values() {\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-reuses-namespace-indices", "crates/sluice-target/src/registry.rs",
     "                self.namespaces_built.fetch_max(end, Ordering::AcqRel);\n", "",
     t("sluice-target", extra=["--test", "reload"])),
    ("readded-ram-namespace-keeps-its-nguid", "crates/sluice-target/src/registry.rs",
     "        let instance = instance_nonce();\n        let reserve", "        let instance = [0u8; 16];\n        let reserve",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-keeps-removed-namespaces", "crates/sluice-target/src/registry.rs",
     "        let gone = removed.iter().filter_map(|nsid| map.remove(nsid)).collect();\n",
     "        let gone = removed.iter().filter_map(|nsid| map.get(nsid).cloned()).collect();\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("idle-queue-keeps-stale-namespaces", "crates/sluice-target/src/queue/mod.rs",
     "            self.session.refresh_namespaces();\n            if self.session.qid == 0",
     "            if self.session.qid == 0",
     t("sluice-target", extra=["--test", "reload"])),
    ("no-event-for-removed-namespaces", "crates/sluice-target/src/events.rs",
     "        changed.extend(self.seen_blocks.keys().filter(|n| !now.contains_key(n)));\n", "",
     t("sluice-target", extra=["--test", "reload"])),
    ("no-event-for-added-namespaces", "crates/sluice-target/src/events.rs",
     "            .filter(|(nsid, blocks)| self.seen_blocks.get(nsid) != Some(blocks))\n",
     "            .filter(|(nsid, blocks)| self.seen_blocks.get(nsid).is_some_and(|b| b != *blocks))\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-skips-revalidation", "crates/sluice-target/src/reload.rs",
     "            if let Err(e) = ns.backend.revalidate() {\n",
     "            if let Err(e) = Ok::<u64, sluice_backend::BackendError>(ns.backend.size_bytes()) {\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("created-file-not-extended", "crates/sluice-target/src/reload.rs",
     "    extend_grown_files(reg, &running, new)?;\n", "",
     t("sluice-target", extra=["--test", "reload"])),
    ("reload-accepts-a-smaller-size", "crates/sluice-target/src/reload.rs",
     "        && n.size_bytes >= r.size_bytes\n", "",
     t("sluice-target", extra=["--test", "reload"])),
    ("file-queue-keeps-its-size-at-open", "crates/sluice-backend/src/file/mod.rs",
     "            size_bytes: self.size_bytes.load(Ordering::Acquire),\n            ..self.geometry\n",
     "            ..self.geometry\n",
     t("sluice-backend")),
    ("file-revalidation-shrinks", "crates/sluice-backend/src/file/mod.rs",
     "        let before = self.size_bytes.fetch_max(found, Ordering::AcqRel);\n",
     "        let before = self.size_bytes.swap(found, Ordering::AcqRel);\n",
     t("sluice-backend")),
    ("async-events-never-posted", "crates/sluice-host/src/controller.rs",
     "        let events = if s.ident.oaes & AEN_NS_ATTRIBUTE != 0 {\n",
     "        let events = if false {\n",
     t("sluice-host", extra=["--test", "e2e"])),
    ("aec-refusal-fails-connect", "crates/sluice-host/src/controller.rs",
     "            match nvme(admin::SET_FEATURES, admin.execute(sf, Payload::None).await) {\n",
     "            match Ok::<Completion, HostError>(nvme(admin::SET_FEATURES, admin.execute(sf, Payload::None).await)?) {\n",
     t("sluice-host", extra=["--test", "e2e"])),
    ("namespace-size-gauge-fixed", "crates/sluice-target/src/tenant/admin.rs",
     "                    i64::try_from(n.size_bytes()).unwrap_or(i64::MAX),\n",
     "                    0,\n",
     t("sluice-target", extra=["--test", "admin"])),
    ("held-request-times-out", "crates/sluice-host/src/core.rs",
     "                    if slot.held || slot.deadline > now {\n",
     "                    if slot.deadline > now {\n",
     t("sluice-host", extra=["--test", "core"])),
    ("shutdown-waits-for-held-requests", "crates/sluice-host/src/core.rs",
     "        self.st.in_flight - self.st.held\n", "        self.st.in_flight\n",
     t("sluice-host", extra=["--test", "core"])),
    ("fuse-file-keeps-its-size", "crates/sluice-export/src/blockio.rs",
     "        self.dev\n            .size_blocks()\n            .saturating_mul(self.bs)\n            .max(self.size_bytes_min)\n",
     "        self.size_bytes_min\n",
     t("sluice-export", extra=["--test", "fuse_uring"])),
    ("fuse-ring-keeps-its-builder", "crates/sluice-export/src/fuse/uring.rs",
     "        d.follow_size();\n", "",
     t("sluice-export", extra=["--test", "fuse_uring"])),
    ("nbd-handshake-tells-the-old-size", "crates/sluice-export/src/nbd/server.rs",
     "                size_bytes: e.dev.size_bytes(),\n                ..e.export.clone()",
     "                size_bytes: e.export.size_bytes,\n                ..e.export.clone()",
     t("sluice-export", extra=["--test", "nbd_e2e"])),
    ("nbd-session-bound-by-the-old-size", "crates/sluice-export/src/nbd/proto.rs",
     "        .is_some_and(|e| e <= session.size_bytes.unwrap_or(export.size_bytes));\n",
     "        .is_some_and(|e| e <= export.size_bytes);\n",
     t("sluice-export", extra=["--test", "nbd_e2e"])),
    ("no-discovery-change-notice", "crates/sluice-target/src/queue/mod.rs",
     "                        c.observe_discovery(reg.genctr(), || reg.nqns_listed_for(&c.hostnqn));\n", "",
     t("sluice-target", extra=["--test", "reload"])),
    ("discovery-notice-for-every-host", "crates/sluice-target/src/events.rs",
     "        if listed != self.listed_seen {\n", "        if true {\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("discovery-log-read-keeps-the-mask", "crates/sluice-target/src/events.rs",
     "        if !retain {\n            self.discovery_notice.clear();\n", "        if !retain {\n",
     t("sluice-target", extra=["--test", "reload"])),
    ("fault-waits-on-stale-claims", "crates/sluice-meta/src/catalog.rs",
     "        let chosen = if others.len() < candidates.len() {\n",
     "        let chosen = if false {\n",
     t("sluice-meta", extra=["--test", "stores", "faults_go_around"])),
    ("reload-api-refusal-is-success", "crates/sluice-admin/src/routes.rs",
     "                    Ok(Err(e)) => json_error(StatusCode::CONFLICT, &e),\n",
     "                    Ok(Err(e)) => json_ok(&e),\n",
     t("sluice-target", extra=["--test", "admin"])),
    ("worker-keeps-retired-queues", "crates/sluice-target/src/server/worker.rs",
     "                None if q.queue.in_flight() == 0 && self.tenancy.queued_for(i) == 0 => {\n",
     "                None if false => {\n",
     t("sluice-target", extra=["--test", "loopback"])),
    # Batched wake-ups of direct queues: the bytes still due, the mark, and
    # reading below it.
    ("rx-due-ignores-pdu-under-way", "crates/sluice-host/src/core.rs",
     "        due.saturating_sub(under_way + self.framer.buffered())\n", "        due\n",
     t("sluice-host", extra=["--test", "core"])),
    ("wake-batch-never-marks", "crates/sluice-host/src/direct.rs",
     "            Some(min) if due >= min.max(1) => low_water_for(due),",
     "            Some(min) if false && due >= min.max(1) => low_water_for(due),",
     t("sluice-host", "sluice-bench", extra=["--test", "direct", "--test", "bench"])),
    ("low-water-blinds-the-pass", "crates/sluice-host/src/direct.rs",
     "        self.read_ready |= self.low_water_bytes > 1;\n", "",
     t("sluice-host", extra=["--test", "direct"])),
    # Reservations.
    ("reservation-check-lets-everyone-in", "crates/sluice-target/src/reservation.rs",
     "        if !self.held.load(SeqCst) {\n            return Ok(());\n        }\n        let s = lock(&self.state);",
     "        if true {\n            return Ok(());\n        }\n        let s = lock(&self.state);",
     t("sluice-target", extra=["--lib", "--test", "reservations"])),
    ("reservation-drain-never-waits", "crates/sluice-target/src/reservation.rs",
     "        self.flips.load(SeqCst) >= ticket + 2 || self.count(slot_of(ticket)) == 0\n",
     "        true\n",
     t("sluice-target", extra=["--lib", "--test", "reservations"])),
    ("preempt-abort-completes-at-once", "crates/sluice-target/src/queue/execute.rs",
     "            if p.ns.reservations.drained(p.ticket) {\n",
     "            if true {\n",
     t("sluice-target", extra=["--test", "reservations"])),
    ("reservation-flush-is-a-read", "crates/sluice-target/src/queue/execute.rs",
     "                if *op == IoOp::Flush || hold.is_some() {\n                    ns.reservations.check(hostid, Access::Write)?;",
     "                if *op == IoOp::Flush || hold.is_some() {\n                    ns.reservations.check(hostid, Access::Read)?;",
     t("sluice-target", extra=["--test", "reservations"])),
    ("preempt-keeps-the-holders-key", "crates/sluice-target/src/reservation.rs",
     "                        let _ = s.preempt_key(prkey, hostid, false);\n", "",
     t("sluice-target", extra=["--lib", "--test", "reservations"])),
    ("reservation-notices-never-taken", "crates/sluice-target/src/controller.rs",
     "            if last != seen {\n", "            if false {\n",
     t("sluice-target", extra=["--test", "reservations"])),
    ("reservation-mask-ignored", "crates/sluice-target/src/events.rs",
     "            if masked & (1 << n.kind) != 0 {\n", "            if false {\n",
     t("sluice-target", extra=["--test", "reservations"])),
    ("report-without-eds-accepted", "crates/sluice-target/src/queue/execute.rs",
     "                let status = if !report.extended {\n", "                let status = if false {\n",
     t("sluice-target", extra=["--test", "reservations"])),
    ("host-identifier-left-zero", "crates/sluice-host/src/controller.rs",
     "        hostid: host_identifier(opts),\n", "        hostid: opts.hostid,\n",
     t("sluice-host", extra=["--test", "e2e"])),
    ("host-reservation-notices-ignored", "crates/sluice-host/src/controller.rs",
     "        if is_reservation_log_available(dw0) {\n", "        if false {\n",
     t("sluice-host", extra=["--test", "e2e"])),
    ("oncs-without-reservations", "crates/sluice-target/src/admin.rs",
     "            oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS\n",
     "            oncs::DSM | oncs::WRITE_ZEROES\n",
     t("sluice-target", "sluice-host", extra=["--test", "reservations", "--test", "e2e"])),
    # Exports: a Unix client's socket holds a queue of large reads' replies.
    ("nbd-unix-send-buffer-default", "crates/sluice-export/src/nbd/server.rs",
     "            widen_unix_send_buffer(&s);\n", "",
     t("sluice-export", extra=["--test", "nbd_e2e"])),
]


def untracked():
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    return {l[3:] for l in out.splitlines() if l.startswith("??")}


def run(name, path, old, new, cmd):
    full = os.path.join(ROOT, path)
    src = open(full).read()
    if src.count(old) != 1:
        return "STALE", f"the text to mutate occurs {src.count(old)} times in {path}"
    before = untracked()
    open(full, "w").write(src.replace(old, new))
    try:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return "HANG", f"the tests ran past {LIMIT_S} s"
        failed = [l for l in out.splitlines() if "panicked at" in l or l.startswith("error")]
        if p.returncode == 0:
            return "SURVIVED", "every test passed"
        return "KILLED", (failed[0] if failed else f"exit {p.returncode}")[:160]
    finally:
        open(full, "w").write(src)
        # Proptest regression files written by failing property tests.
        for f in untracked() - before:
            if "proptest-regressions" in f:
                os.remove(os.path.join(ROOT, f))


def interrupted(signum, _frame):
    # Unwinds through `run`'s `finally`, which puts the file back.
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGTERM, interrupted)
    args = sys.argv[1:]
    if "--list" in args:
        for m in MUTANTS:
            print(m[0])
        return 0
    chosen = [m for m in MUTANTS if not args or m[0] in args]
    unknown = set(args) - {m[0] for m in MUTANTS}
    if unknown:
        print(f"mutation-check: unknown mutant(s): {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *{m[1] for m in chosen}],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if dirty:
        print(f"mutation-check: uncommitted changes in files it edits:\n{dirty}", file=sys.stderr)
        return 2
    bad = 0
    for name, path, old, new, cmd in chosen:
        status, why = run(name, path, old, new, cmd)
        bad += status != "KILLED"
        print(f"{status:8} {name}: {why}", flush=True)
    print(f"mutation-check: {len(chosen) - bad} of {len(chosen)} killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
