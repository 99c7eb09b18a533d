// Preloaded into Azurite (NODE_OPTIONS=--require) when it keeps its data on disk: the
// table service answers a write only once its data file holds that write.
//
// Why: Azurite's table store is LokiJS in memory, saved to disk by a 5 s autosave timer, so
// `kill -9` of Azurite lost every write of the last seconds that it had already answered
// (27 accepted orders in issue #15's probe). Azurite has no option for it (3.37: the
// interval is a constant in LokiTableMetadataStore), hence this patch.
//
// How: after each write that is not part of a batch, and after each batch, the store
// saves the database and only then returns, so the HTTP answer follows the save. LokiJS
// coalesces saves (a save asked for while one runs is done once, right after it, for
// every caller that asked), so concurrent writes share a save: a group commit. Each save
// writes the whole database to a temporary file and renames it over the old one, so a
// kill mid-save leaves the previous complete file. No fsync: this survives the death of
// the Azurite process, not of the machine.
"use strict";

const fs = require("fs");
const path = require("path");

const WRITES = [
  "createTable",
  "deleteTable",
  "setTableACL",
  "setServiceProperties",
  "insertTableEntity",
  "insertOrUpdateTableEntity",
  "insertOrMergeTableEntity",
  "updateTableEntity",
  "mergeTableEntity",
  "deleteTableEntity",
];

function azuriteSource() {
  // argv[1] is Azurite's entry script (dist/src/azurite.js or dist/src/table/main.js).
  const script = fs.realpathSync(process.argv[1]);
  const marker = `${path.sep}dist${path.sep}src${path.sep}`;
  const at = script.lastIndexOf(marker);
  if (at < 0) {
    throw new Error(`azurite_durable: ${script} is not an Azurite entry script`);
  }
  return script.slice(0, at + marker.length);
}

function save(store) {
  return new Promise((resolve, reject) => {
    store.db.saveDatabase((err) => (err ? reject(err) : resolve()));
  });
}

function onDisk(store) {
  return store.db.persistenceMethod === "fs";
}

const modulePath = path.join(azuriteSource(), "table", "persistence", "LokiTableMetadataStore.js");
const Store = require(modulePath).default;
const batches = new WeakMap();

function openBatches(store) {
  let open = batches.get(store);
  if (open === undefined) {
    open = new Set();
    batches.set(store, open);
  }
  return open;
}

for (const name of WRITES) {
  const write = Store.prototype[name];
  Store.prototype[name] = async function durableWrite(...args) {
    const result = await write.apply(this, args);
    const open = openBatches(this);
    if (onDisk(this) && !args.some((arg) => open.has(arg))) {
      await save(this);
    }
    return result;
  };
}

const begin = Store.prototype.beginBatchTransaction;
Store.prototype.beginBatchTransaction = async function durableBegin(batchId) {
  openBatches(this).add(batchId);
  return begin.call(this, batchId);
};

const end = Store.prototype.endBatchTransaction;
Store.prototype.endBatchTransaction = async function durableEnd(...args) {
  try {
    return await end.apply(this, args);
  } finally {
    openBatches(this).delete(args[2]);
    if (onDisk(this)) {
      await save(this);
    }
  }
};
