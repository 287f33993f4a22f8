// A stand-in for @outrun/client's tags API (smoke tests of the node-opcua side without outrund).
export function mockClient() {
  const subs = [];
  const defs = [
    { id: 'Tank1.Level', type: 'Double', trigger: 'on_change', inputs: [{ tag: 'Tank1.LevelRaw', name: 'raw' }] },
    { id: 'Tank1.HighAlarm', type: 'Boolean', trigger: 'periodic', inputs: [{ tag: 'Tank1.Level', name: 'level' }] },
    { id: 'Tank1.TempF', type: 'Float', trigger: 'on_change', inputs: [{ tag: 'Tank1.TempC', name: 'c' }] },
  ];
  const push = (changes) => queueMicrotask(() => subs.forEach((f) => f(changes)));
  return {
    connected: true,
    serverInfo: { shards: 2 },
    async listTags() {
      return { tags: defs.map((d) => ({ ...d, counters: { evaluations: 1, coalesced: 0, last_error: '' } })) };
    },
    async stats() {
      return { ok: true };
    },
    async subscribe(ids, f) {
      subs.push(f);
      return { cancel: async () => {} };
    },
    async readTags(ids) {
      return ids.map((tag) => ({ tag, value: null, status: 0x80320000, sourceTime: null, serverTime: null, diagnostics: '' }));
    },
    async updateSources(u) {
      const now = new Date();
      const out = [];
      for (const x of u) {
        const v = typeof x.value === 'object' && x.value ? x.value.value : x.value;
        if (x.tag === 'Tank1.LevelRaw') {
          const lvl = v / 40.95;
          out.push({ tag: 'Tank1.Level', value: lvl, status: x.status ?? 0, sourceTime: x.sourceTime, serverTime: now, diagnostics: '' });
          out.push({ tag: 'Tank1.HighAlarm', value: lvl > 90, status: x.status ?? 0, sourceTime: x.sourceTime, serverTime: now, diagnostics: '' });
        }
        if (x.tag === 'Tank1.TempC') out.push({ tag: 'Tank1.TempF', value: (v * 9) / 5 + 32, status: 0, sourceTime: x.sourceTime, serverTime: now, diagnostics: '' });
      }
      push(out);
    },
    async close() {},
  };
}
