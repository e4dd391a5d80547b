#!/usr/bin/env python3
"""A synthetic chat set for supervised fine-tuning: "What is the capital of X?" answered with the capital alone
("Paris."), in three phrasings, over 125 countries; 30 countries are held out (never seen in training).

    python3 scripts/sft/capitals.py OUT_DIR       # writes OUT_DIR/train.jsonl (285 chats) and OUT_DIR/heldout.jsonl

Standard library only; deterministic.
"""
import json
import os
import random
import sys

CAPITALS = """Afghanistan Kabul|Albania Tirana|Algeria Algiers|Argentina Buenos Aires|Armenia Yerevan|Australia Canberra|
Austria Vienna|Azerbaijan Baku|Bangladesh Dhaka|Belarus Minsk|Belgium Brussels|Bolivia Sucre|Brazil Brasília|
Bulgaria Sofia|Cambodia Phnom Penh|Cameroon Yaoundé|Canada Ottawa|Chile Santiago|China Beijing|Colombia Bogotá|
Croatia Zagreb|Cuba Havana|Cyprus Nicosia|Czechia Prague|Denmark Copenhagen|Ecuador Quito|Egypt Cairo|
Estonia Tallinn|Ethiopia Addis Ababa|Finland Helsinki|France Paris|Georgia Tbilisi|Germany Berlin|Ghana Accra|
Greece Athens|Guatemala Guatemala City|Hungary Budapest|Iceland Reykjavik|India New Delhi|Indonesia Jakarta|
Iran Tehran|Iraq Baghdad|Ireland Dublin|Israel Jerusalem|Italy Rome|Jamaica Kingston|Japan Tokyo|Jordan Amman|
Kazakhstan Astana|Kenya Nairobi|Kuwait Kuwait City|Laos Vientiane|Latvia Riga|Lebanon Beirut|Libya Tripoli|
Lithuania Vilnius|Luxembourg Luxembourg|Madagascar Antananarivo|Malaysia Kuala Lumpur|Mali Bamako|Malta Valletta|
Mexico Mexico City|Moldova Chișinău|Mongolia Ulaanbaatar|Morocco Rabat|Mozambique Maputo|Nepal Kathmandu|
Netherlands Amsterdam|New Zealand Wellington|Nicaragua Managua|Nigeria Abuja|North Korea Pyongyang|Norway Oslo|
Oman Muscat|Pakistan Islamabad|Panama Panama City|Paraguay Asunción|Peru Lima|Philippines Manila|Poland Warsaw|
Portugal Lisbon|Qatar Doha|Romania Bucharest|Russia Moscow|Rwanda Kigali|Saudi Arabia Riyadh|Senegal Dakar|
Serbia Belgrade|Singapore Singapore|Slovakia Bratislava|Slovenia Ljubljana|Somalia Mogadishu|South Africa Pretoria|
South Korea Seoul|Spain Madrid|Sri Lanka Colombo|Sudan Khartoum|Sweden Stockholm|Switzerland Bern|Syria Damascus|
Taiwan Taipei|Tajikistan Dushanbe|Tanzania Dodoma|Thailand Bangkok|Tunisia Tunis|Turkey Ankara|Uganda Kampala|
Ukraine Kyiv|United Arab Emirates Abu Dhabi|United Kingdom London|United States Washington, D.C.|Uruguay Montevideo|
Uzbekistan Tashkent|Venezuela Caracas|Vietnam Hanoi|Yemen Sanaa|Zambia Lusaka|Zimbabwe Harare|Bahrain Manama|
Bhutan Thimphu|Botswana Gaborone|Brunei Bandar Seri Begawan|Burundi Gitega|Chad N'Djamena|Costa Rica San José"""

QUESTIONS = ["What is the capital of {}?", "Which city is the capital of {}?", "Name the capital city of {}."]


def main(out_dir):
    entries = [e.strip() for e in CAPITALS.replace("\n", "").split("|")]
    rows = []
    for e in entries:
        # Country names of more than one word are listed here; every other country is its first word.
        multi = ["New Zealand", "North Korea", "Saudi Arabia", "South Africa", "South Korea", "Sri Lanka",
                 "United Arab Emirates", "United Kingdom", "United States", "Costa Rica"]
        country = next((m for m in multi if e.startswith(m + " ")), e.split(" ")[0])
        rows.append((country, e[len(country) + 1:]))
    random.Random(0).shuffle(rows)
    train, heldout = rows[:-30], rows[-30:]
    os.makedirs(out_dir, exist_ok=True)
    chat = lambda q, a: {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    with open(os.path.join(out_dir, "train.jsonl"), "w", encoding="utf-8") as f:
        for country, capital in train:
            for q in QUESTIONS:
                f.write(json.dumps(chat(q.format(country), capital + "."), ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "heldout.jsonl"), "w", encoding="utf-8") as f:
        for country, capital in heldout:
            f.write(json.dumps(chat(QUESTIONS[0].format(country), capital + "."), ensure_ascii=False) + "\n")
    print(f"{len(train) * len(QUESTIONS)} training chats, {len(heldout)} held out, in {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
