// The served model's name and notice (GET v1/model, server/model_info.py), shown before anyone speaks:
// whoever opens the page learns what the model recognises (a demo model says so, and how to serve a real
// one) instead of speaking to it and getting nothing. Asked of the server that served the page.
"use strict";

(() => {
  const MODEL_PATH = "v1/model"; // resolved against the page, like the stream path in app.js

  // Server paths are absolute ("/v1/model/card"); resolve them against the page so a proxy prefix works.
  const pageUrl = (path) => new URL(path.replace(/^\//, ""), document.baseURI).href;

  function show(box, info) {
    const name = document.createElement("strong");
    name.textContent = `Model ${info.name}`;
    const parts = [name];
    const about = info.notice || (info.languages.length ? `languages: ${info.languages.join(", ")}` : "");
    if (about) parts.push(document.createTextNode(` · ${about}`));
    if (info.card) {
      const card = document.createElement("a");
      card.href = pageUrl(info.card);
      card.textContent = "model card";
      card.target = "_blank";
      parts.push(document.createTextNode(" · "), card);
    }
    box.replaceChildren(...parts);
    box.dataset.notice = info.notice ? "yes" : "no";
    box.hidden = false;
    offerLanguages(document.getElementById("language"), info.languages);
  }

  // Only the languages this model knows (a Paraformer: Mandarin and English), so none ends in bad_start.
  function offerLanguages(select, languages) {
    if (!select || !Array.isArray(languages) || !languages.length) return;
    for (const option of select.options) {
      option.disabled = option.hidden = option.value !== "auto" && !languages.includes(option.value);
    }
    if (select.selectedOptions[0]?.disabled) select.value = "auto";
  }

  (async () => {
    try {
      const response = await fetch(pageUrl(MODEL_PATH), { cache: "no-store" });
      if (response.ok) show(document.getElementById("model"), await response.json());
    } catch (error) {
      console.warn("no model description:", error); // an older server: the page works without it
    }
  })();
})();
