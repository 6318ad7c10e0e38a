// Relaymesh dashboard: the only script the pages load (CSP: script-src
// 'self', Trusted Types enforced). It writes with textContent and
// attributes only, never HTML, and builds no selector from data.
"use strict";

// Filter: <input data-filter="TABLE-ID"> hides the rows of that table
// whose text does not contain what is typed.
function setUpFilters() {
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const table = document.getElementById(input.dataset.filter);
    if (!table || !table.tBodies.length) continue;
    input.addEventListener("input", () => {
      const q = input.value.trim().toLowerCase();
      for (const row of table.tBodies[0].rows) {
        row.hidden = q !== "" && !row.textContent.toLowerCase().includes(q);
      }
    });
  }
}

// elementsOf returns the elements with data-vm (and data-mesh) equal to
// the given values and data-field set, keyed by field; compared in script,
// since the values are cluster data.
function elementsOf(vm, mesh) {
  const out = {};
  for (const el of document.querySelectorAll("[data-vm][data-field]")) {
    if (el.dataset.vm !== vm) continue;
    if ((el.dataset.mesh || null) !== (mesh === undefined ? null : mesh)) continue;
    (out[el.dataset.field] = out[el.dataset.field] || []).push(el);
  }
  return out;
}

function setText(els, value) {
  for (const el of els || []) {
    if (el.textContent !== value) el.textContent = value;
  }
}

function short(fp) {
  return fp && fp.length > 16 ? fp.slice(0, 16) + "…" : (fp || "");
}

function when(t) {
  if (!t || t.startsWith("0001-")) return "—";
  return t.replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// The Trust page follows a rotation: it polls /api/v1/trust and updates
// the phase, step, progress and each mesh's intermediate in place.
function followTrust(section) {
  const url = section.dataset.live;
  const stamp = section.querySelector("[data-updated]");
  let failures = 0;
  async function poll() {
    try {
      const res = await fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } });
      if (res.status === 401 || res.status === 403) {
        if (stamp) stamp.textContent = "stopped: session ended (reload to sign in)";
        return;
      }
      if (!res.ok) throw new Error("HTTP " + res.status);
      const body = await res.json();
      const vms = (body.data && body.data.virtualMeshes) || [];
      const relay = body.data && body.data.relay;
      if (relay) {
        const r = {};
        for (const el of document.querySelectorAll("[data-relay]")) (r[el.dataset.relay] = r[el.dataset.relay] || []).push(el);
        setText(r.phase, relay.phase);
        setText(r.phaseText, relay.phase);
        setText(r.since, relay.sinceAgo || "");
        setText(r.acked, String(relay.acked));
      }
      for (const vm of vms) {
        const f = elementsOf(vm.virtualMesh);
        setText(f.state, vm.state);
        setText(f.phase, vm.phase);
        setText(f.stepText, String(vm.step));
        setText(f.done, String(vm.done));
        setText(f.since, vm.sinceAgo || "");
        setText(f.message, vm.message || "");
        setText(f.awaiting, vm.awaitingContinue ? "waiting for relaymesh ca rotate continue" : "");
        setText(f.root, short(vm.rootFingerprint));
        if (vm.newRoot) setText(f.roots, short(vm.oldRoot) + " → " + short(vm.newRoot));
        for (const p of f.step || []) p.value = vm.step;
        for (const m of vm.meshes || []) {
          const g = elementsOf(vm.virtualMesh, m.mesh);
          setText(g.serial, short(m.serial));
          setText(g.notAfter, when(m.notAfter));
          setText(g.issuer, m.issuer);
          setText(g.progress, m.progress);
          for (const el of g.progress || []) el.className = m.pending ? "warn" : "okay";
        }
      }
      section.dataset.phases = vms.map((vm) => vm.phase).join(" ");
      failures = 0;
      if (stamp) stamp.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      failures++;
      if (stamp) stamp.textContent = "update failed (" + failures + "), retrying";
    }
    setTimeout(poll, Math.min(2000 * (1 + failures), 15000));
  }
  setTimeout(poll, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  setUpFilters();
  const trust = document.getElementById("trust");
  if (trust && trust.dataset.live) followTrust(trust);
});
